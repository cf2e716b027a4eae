//! One `#[message]` or `#[command]` method, read: the request type it becomes (its arguments
//! are the fields), where it takes the entity's context, and what it answers.

use proc_macro2::Span;
use quote::format_ident;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, ImplItemFn, Pat, ReceiverKind, ReturnType, Type};

use crate::kind::Kind;

/// An argument of the method, in its order.
pub enum Arg {
    /// A field of the request, by name.
    Field(Ident),
    /// The entity's context (`&EntityContext` or `&mut EntityContext`).
    Context,
}

/// A method that handles one request.
pub struct Handler {
    /// The method, without its marker attribute.
    pub method: ImplItemFn,
    /// The request type, and its variant in the message and reply enums: the method's name in
    /// CamelCase.
    pub request: Ident,
    /// The request's fields: the arguments that are not the context.
    pub fields: Vec<(Ident, Type)>,
    /// The arguments as the method takes them.
    pub args: Vec<Arg>,
    /// What the request is answered with.
    pub reply: Type,
    /// The method's doc comment, for the request type.
    pub docs: Vec<Attribute>,
}

impl Handler {
    /// Reads `method`, which carried `kind`'s marker attribute.
    pub fn read(kind: &Kind, mut method: ImplItemFn) -> syn::Result<Handler> {
        method.attrs.retain(|a| !a.path().is_ident(kind.marker));
        let sig = &method.sig;
        let name = sig.ident.unraw().to_string();
        if kind.reserved.contains(&name.as_str()) {
            return Err(syn::Error::new(
                sig.ident.span(),
                format!("`{name}` is a method of {}: give the {} another name", kind.trait_name, kind.marker),
            ));
        }
        if !sig.generics.params.is_empty() {
            return Err(syn::Error::new_spanned(
                &sig.generics,
                format!("a {} cannot be generic: its request is one type", kind.marker),
            ));
        }
        if sig.asyncness.is_some() && !kind.async_allowed {
            return Err(syn::Error::new(
                sig.asyncness.span(),
                format!(
                    "a {} is decided synchronously: write `decide_with` by hand to await before deciding",
                    kind.marker
                ),
            ));
        }
        let mut receiver = false;
        let mut fields = Vec::new();
        let mut args = Vec::new();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(r) => {
                    let by_reference = match &r.kind {
                        ReceiverKind::Reference(_, _, mutable) => mutable.is_none() || kind.mut_self_allowed,
                        _ => false,
                    };
                    if !by_reference {
                        let wanted = if kind.mut_self_allowed { "`&self` or `&mut self`" } else { "`&self`" };
                        return Err(syn::Error::new_spanned(r, format!("a {} takes {wanted}", kind.marker)));
                    }
                    receiver = true;
                }
                FnArg::Typed(arg) if is_context(&arg.ty) => {
                    if !kind.context_allowed {
                        return Err(syn::Error::new_spanned(
                            &arg.ty,
                            format!("a {} takes no context: write `decide_with` by hand for that", kind.marker),
                        ));
                    }
                    args.push(Arg::Context);
                }
                FnArg::Typed(arg) => {
                    let Pat::Ident(pat) = &*arg.pat else {
                        return Err(syn::Error::new_spanned(
                            &arg.pat,
                            "name the argument: it becomes a field of the request",
                        ));
                    };
                    if let Type::Reference(_) = &*arg.ty {
                        return Err(syn::Error::new_spanned(
                            &arg.ty,
                            "a request travels between nodes: take an owned value, not a reference",
                        ));
                    }
                    fields.push((pat.ident.clone(), (*arg.ty).clone()));
                    args.push(Arg::Field(pat.ident.clone()));
                }
            }
        }
        if !receiver {
            return Err(syn::Error::new_spanned(
                &sig.ident,
                format!(
                    "a {} takes `&self`{}",
                    kind.marker,
                    if kind.mut_self_allowed { " or `&mut self`" } else { "" }
                ),
            ));
        }
        let reply = match &sig.output {
            ReturnType::Default => syn::parse_quote!(()),
            ReturnType::Type(_, ty) => (**ty).clone(),
        };
        let reply = match kind.reply_of(&reply) {
            Some(r) => r,
            None => {
                return Err(syn::Error::new(
                    sig.output.span(),
                    format!(
                        "a {} returns `(Vec<Self::Event>, Reply)`: the events to persist and the answer",
                        kind.marker
                    ),
                ))
            }
        };
        let docs = method.attrs.iter().filter(|a| a.path().is_ident("doc")).cloned().collect();
        Ok(Handler { request: camel(&name, sig.ident.span()), method, fields, args, reply, docs })
    }
}

/// `&EntityContext` or `&mut EntityContext`, by any path.
fn is_context(ty: &Type) -> bool {
    let Type::Reference(r) = ty else { return false };
    let Type::Path(p) = &*r.elem else { return false };
    p.path.segments.last().is_some_and(|s| s.ident == "EntityContext")
}

/// `add_item` as `AddItem`.
fn camel(name: &str, span: Span) -> Ident {
    let camel: String = name
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
        })
        .collect();
    format_ident!("{}", camel, span = span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_camel_case() {
        let span = Span::call_site();
        assert_eq!(camel("add_item", span), "AddItem");
        assert_eq!(camel("get", span), "Get");
        assert_eq!(camel("check__out_", span), "CheckOut");
    }
}

//! One `#[message]` or `#[command]` method, read: the request type it becomes (its arguments
//! are the fields), where it takes the entity's context, and what it answers.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, ImplItemFn, Pat, ReceiverKind, ReturnType, Type};

use crate::kind::Kind;
use crate::self_type;

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
    /// The method's `cfg`s, for everything written for it.
    pub cfgs: Vec<Attribute>,
}

impl Handler {
    /// Reads `method` of the impl for `self_ty`, which carried `kind`'s marker attribute.
    pub fn read(kind: &Kind, self_ty: &Type, method: ImplItemFn) -> syn::Result<Handler> {
        let (marker, mut attrs): (Vec<Attribute>, Vec<Attribute>) =
            method.attrs.iter().cloned().partition(|a| a.path().is_ident(kind.marker));
        let renamed = marker.iter().map(name_given).collect::<syn::Result<Vec<_>>>()?.into_iter().flatten().next();
        // The handler is moved to an inherent impl: `Self::Event` must name its trait there.
        let moved: ImplItemFn = {
            let mut m = method.clone();
            m.attrs.clear();
            let tokens = self_type::rewrite(kind, m.to_token_stream(), None);
            let mut m: ImplItemFn = syn::parse2(tokens)?;
            attrs.append(&mut m.attrs);
            m.attrs = attrs;
            m
        };
        let sig = &method.sig;
        let name = sig.ident.unraw().to_string();
        if kind.reserved.contains(&name.as_str()) {
            return Err(syn::Error::new(
                sig.ident.span(),
                format!("`{name}` is a method of {}: give the {} another name", kind.trait_name, kind.marker),
            ));
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            let what = format!("a {} cannot be generic or name lifetimes: its request is one type", kind.marker);
            return Err(syn::Error::new_spanned(&sig.generics, what));
        }
        if let syn::Safety::Unsafe(unsafety) = &sig.safety {
            return Err(syn::Error::new_spanned(unsafety, format!("a {} cannot be `unsafe`", kind.marker)));
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
                    if let Some(a) = arg.attrs.first() {
                        return Err(syn::Error::new_spanned(
                            a,
                            "an argument's attributes would not reach its field: put them on the method",
                        ));
                    }
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
                    refuse_impl_trait(&arg.ty)?;
                    fields.push((pat.ident.clone(), moved_out(kind, &arg.ty, self_ty)?));
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
            ReturnType::Type(_, ty) => {
                refuse_impl_trait(ty)?;
                (**ty).clone()
            }
        };
        let reply = match kind.reply_of(&reply) {
            Some(r) => moved_out(kind, &r, self_ty)?,
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
        let request = match renamed {
            Some(given) => given,
            None => camel(&name, sig.ident.span()).ok_or_else(|| {
                syn::Error::new(
                    sig.ident.span(),
                    format!("`{name}` makes no type name: name its request, #[{}(name = \"…\")]", kind.marker),
                )
            })?,
        };
        // `fn status(&self) -> Status` would define a second `Status` beside the one it returns.
        let used = fields.iter().map(|(_, t)| t.to_token_stream()).chain([reply.to_token_stream()]);
        if used.into_iter().any(|t| mentions(t, &request)) {
            let what = format!("the request type `{request}` would shadow the type `{request}` this {} uses: name it, #[{}(name = \"…\")]", kind.marker, kind.marker);
            return Err(syn::Error::new(sig.ident.span(), what));
        }
        let docs = moved.attrs.iter().filter(|a| a.path().is_ident("doc")).cloned().collect();
        let cfgs = moved.attrs.iter().filter(|a| a.path().is_ident("cfg")).cloned().collect();
        Ok(Handler { request, method: moved, fields, args, reply, docs, cfgs })
    }
}

/// The name given by `#[message(name = "…")]`, if any.
fn name_given(marker: &Attribute) -> syn::Result<Option<Ident>> {
    if matches!(marker.meta, syn::Meta::Path(_)) {
        return Ok(None);
    }
    let mut name = None;
    marker.parse_nested_meta(|meta| {
        if meta.path.is_ident("name") {
            let given: syn::LitStr = meta.value()?.parse()?;
            name = Some(given.parse::<Ident>()?);
            Ok(())
        } else {
            Err(meta.error("the one setting is `name = \"RequestName\"`"))
        }
    })?;
    Ok(name)
}

/// A type of the handler as it reads outside the impl: `Self` is the entity's type.
fn moved_out(kind: &Kind, ty: &Type, self_ty: &Type) -> syn::Result<Type> {
    syn::parse2(self_type::rewrite(kind, ty.to_token_stream(), Some(self_ty)))
}

/// `impl Trait` cannot be a field's or a variant's type.
fn refuse_impl_trait(ty: &Type) -> syn::Result<()> {
    let found = ty.to_token_stream().into_iter().find(|t| matches!(t, TokenTree::Ident(i) if i == "impl"));
    match found {
        Some(t) => Err(syn::Error::new(
            t.span(),
            "a request's fields and reply are stored types: name the type, not `impl Trait`",
        )),
        None => Ok(()),
    }
}

/// Whether `tokens` name `ident` anywhere.
fn mentions(tokens: TokenStream, ident: &Ident) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == *ident,
        TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}

/// `&EntityContext` or `&mut EntityContext`, by any path.
fn is_context(ty: &Type) -> bool {
    let Type::Reference(r) = ty else { return false };
    let Type::Path(p) = &*r.elem else { return false };
    p.path.segments.last().is_some_and(|s| s.ident == "EntityContext")
}

/// `add_item` as `AddItem` (None: no letter to start a type name with).
fn camel(name: &str, span: Span) -> Option<Ident> {
    let camel: String = name
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
        })
        .collect();
    camel.starts_with(|c: char| c.is_alphabetic()).then(|| format_ident!("{}", camel, span = span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_camel_case() {
        let span = Span::call_site();
        let camel = |n| camel(n, span).map(|i| i.to_string());
        assert_eq!(camel("add_item").as_deref(), Some("AddItem"));
        assert_eq!(camel("get").as_deref(), Some("Get"));
        assert_eq!(camel("check__out_").as_deref(), Some("CheckOut"));
        assert_eq!(camel("__"), None);
        assert_eq!(camel("_1x"), None);
    }
}

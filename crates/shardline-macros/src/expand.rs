//! What the attributes write: a request type per handler, the message and reply enums that
//! travel, the `Request` impls that pair them, the handlers as inherent methods, and the trait's
//! dispatch (`handle` or `decide`).

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{ImplItem, ItemImpl, Type, Visibility};

use crate::handler::{Arg, Handler};
use crate::kind::Kind;

/// Expands `#[messages(vis)]` or `#[commands(vis)]` on `item`; a compile error on misuse.
pub fn expand(kind: &Kind, attr: TokenStream, item: TokenStream) -> TokenStream {
    match try_expand(kind, attr, item) {
        Ok(tokens) => tokens,
        Err(e) => e.to_compile_error(),
    }
}

fn try_expand(kind: &Kind, attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let vis: Visibility = if attr.is_empty() { Visibility::Inherited } else { syn::parse2(attr)? };
    let mut block: ItemImpl = syn::parse2(item)?;
    let trait_named =
        block.trait_.as_ref().and_then(|(path, _)| path.segments.last()).is_some_and(|s| s.ident == kind.trait_name);
    if !trait_named {
        let what = format!("put #[{}s] on `impl {} for YourType`", kind.marker, kind.trait_name);
        return Err(syn::Error::new_spanned(&block.self_ty, what));
    }
    if !block.generics.params.is_empty() {
        let what = format!("a generic {}: write its {} and Reply types by hand", kind.trait_name, kind.message_type);
        return Err(syn::Error::new_spanned(&block.generics, what));
    }
    let base = match &*block.self_ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| s.ident.clone()),
        _ => None,
    };
    let Some(base) = base else {
        return Err(syn::Error::new_spanned(&block.self_ty, "the entity must be a named type"));
    };

    let mut handlers = Vec::new();
    let mut errors: Option<syn::Error> = None;
    let mut kept = Vec::new();
    for item in std::mem::take(&mut block.items) {
        match item {
            ImplItem::Fn(f) if f.attrs.iter().any(|a| a.path().is_ident(kind.marker)) => {
                match Handler::read(kind, &block.self_ty, f) {
                    Ok(h) => handlers.push(h),
                    Err(e) => match &mut errors {
                        Some(all) => all.combine(e),
                        None => errors = Some(e),
                    },
                }
            }
            ImplItem::Type(t) if t.ident == kind.message_type || t.ident == "Reply" => {
                let what = format!("#[{}s] writes `type {}`: remove this one", kind.marker, t.ident);
                return Err(syn::Error::new_spanned(&t.ident, what));
            }
            ImplItem::Fn(f) if f.sig.ident == kind.dispatch() => {
                let what = format!(
                    "#[{}s] writes `{}` from the #[{}] methods: remove this one",
                    kind.marker,
                    kind.dispatch(),
                    kind.marker
                );
                return Err(syn::Error::new_spanned(&f.sig.ident, what));
            }
            other => kept.push(other),
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }
    for (i, h) in handlers.iter().enumerate() {
        if let Some(first) = handlers[..i].iter().find(|o| o.request == h.request) {
            let what = format!(
                "`{}` and `{}` both make the request `{}`: name one, #[{}(name = \"…\")]",
                first.method.sig.ident, h.method.sig.ident, h.request, kind.marker
            );
            return Err(syn::Error::new(h.method.sig.ident.span(), what));
        }
    }
    if handlers.is_empty() {
        let what = format!("no #[{}] method: mark each handler with #[{}]", kind.marker, kind.marker);
        return Err(syn::Error::new_spanned(&block.self_ty, what));
    }
    block.items = kept;

    let message = format_ident!("{}{}", base, kind.message_type);
    let reply = format_ident!("{}Reply", base);
    let requests = handlers.iter().map(|h| request_type(&vis, h, &message, &reply));
    let enums = enums(kind, &vis, &base, &handlers, &message, &reply);
    let dispatch = dispatch(kind, &handlers, &message, &reply);
    let methods = handlers.iter().map(|h| &h.method);
    let self_ty = &block.self_ty;
    block.items.push(syn::parse2(quote!(type Reply = #reply;))?);
    let message_type = format_ident!("{}", kind.message_type);
    block.items.push(syn::parse2(quote!(type #message_type = #message;))?);
    block.items.push(syn::parse2(dispatch)?);
    Ok(quote! {
        #(#requests)*
        #enums
        impl #self_ty {
            #(#methods)*
        }
        #block
    })
}

/// The serde derive, through the runtime's own serde so that users need no dependency on it.
fn serde() -> TokenStream {
    quote! {
        #[derive(::shardline::__private::serde::Serialize, ::shardline::__private::serde::Deserialize)]
        #[serde(crate = "::shardline::__private::serde")]
    }
}

/// One request's type and its `Request` impl.
fn request_type(vis: &Visibility, h: &Handler, message: &syn::Ident, reply: &syn::Ident) -> TokenStream {
    let (name, answer, cfgs) = (&h.request, &h.reply, &h.cfgs);
    let docs = if h.docs.is_empty() {
        let doc = format!("The request of `{}`.", h.method.sig.ident);
        quote!(#[doc = #doc])
    } else {
        let docs = &h.docs;
        quote!(#(#docs)*)
    };
    let serde = serde();
    let body = if h.fields.is_empty() {
        quote!(;)
    } else {
        let fields = h.fields.iter().map(|(f, ty)| quote!(#[allow(missing_docs)] #vis #f: #ty));
        quote!({ #(#fields),* })
    };
    quote! {
        #docs
        #(#cfgs)*
        #serde
        #[derive(Debug, Clone)]
        #vis struct #name #body

        #(#cfgs)*
        impl ::shardline::Request<#message, #reply> for #name {
            type Reply = #answer;
            fn into_message(self) -> #message {
                #message::#name(self)
            }
            #[allow(unreachable_patterns)]
            fn from_reply(reply: #reply) -> ::core::result::Result<#answer, #reply> {
                match reply {
                    #reply::#name(answer) => ::core::result::Result::Ok(answer),
                    other => ::core::result::Result::Err(other),
                }
            }
        }
    }
}

/// The message and reply enums, a variant per handler in the order written.
fn enums(
    kind: &Kind,
    vis: &Visibility,
    base: &syn::Ident,
    handlers: &[Handler],
    message: &syn::Ident,
    reply: &syn::Ident,
) -> TokenStream {
    let serde = serde();
    let names: Vec<_> = handlers.iter().map(|h| &h.request).collect();
    let answers = handlers.iter().map(|h| &h.reply);
    let cfgs: Vec<_> = handlers.iter().map(|h| &h.cfgs).collect();
    let message_doc = format!(
        "The {}s of [`{base}`], one variant per request, in the order the handlers are written \
         (the encoding numbers them: add new ones last). Written by `#[{}s]`.",
        kind.marker, kind.marker
    );
    let reply_doc = format!("The replies of [`{base}`], a variant per request. Written by `#[{}s]`.", kind.marker);
    quote! {
        #[doc = #message_doc]
        #serde
        #[derive(Debug, Clone)]
        #vis enum #message {
            #(#(#cfgs)* #[allow(missing_docs)] #names(#names)),*
        }

        #[doc = #reply_doc]
        #serde
        #vis enum #reply {
            #(#(#cfgs)* #[allow(missing_docs)] #names(#answers)),*
        }
    }
}

/// `handle` (messages) or `decide` (commands): each request to its method.
fn dispatch(kind: &Kind, handlers: &[Handler], message: &syn::Ident, reply: &syn::Ident) -> TokenStream {
    // The dispatch's own names, out of reach of the user's (an argument named `ctx`, `events`).
    let local = |name: &str| proc_macro2::Ident::new(name, proc_macro2::Span::mixed_site());
    let (ctx, msg, events, answer) = (local("ctx"), local("msg"), local("events"), local("answer"));
    let arms = handlers.iter().map(|h| {
        let cfgs = &h.cfgs;
        let name = &h.request;
        let method = &h.method.sig.ident;
        let fields = h.fields.iter().map(|(f, _)| f);
        let args = h.args.iter().map(|a| match a {
            Arg::Field(f) => quote!(#f),
            Arg::Context => quote!(#ctx),
        });
        let call = quote!(Self::#method(self, #(#args),*));
        let call = if h.method.sig.asyncness.is_some() { quote!(#call.await) } else { call };
        let pattern = if h.fields.is_empty() { quote!(#name) } else { quote!(#name { #(#fields),* }) };
        if kind.context_allowed {
            quote!(#(#cfgs)* #message::#name(#pattern) => #reply::#name(#call))
        } else {
            quote!(#(#cfgs)* #message::#name(#pattern) => {
                let (#events, #answer) = #call;
                (#events, #reply::#name(#answer))
            })
        }
    });
    if kind.context_allowed {
        quote! {
            #[allow(unused_variables)]
            async fn handle(&mut self, #ctx: &mut ::shardline::EntityContext, #msg: #message) -> #reply {
                match #msg { #(#arms),* }
            }
        }
    } else {
        quote! {
            fn decide(&self, #msg: #message) -> (::std::vec::Vec<<Self as ::shardline::EventSourced>::Event>, #reply) {
                match #msg { #(#arms),* }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::{COMMANDS, MESSAGES};

    /// The compile error `item` expands to under `kind` (empty: it expanded).
    fn error_of(kind: &Kind, item: TokenStream) -> String {
        match try_expand(kind, TokenStream::new(), item) {
            Ok(_) => String::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "),
        }
    }

    #[track_caller]
    fn refused(kind: &Kind, item: TokenStream, says: &str) {
        let error = error_of(kind, item);
        assert!(error.contains(says), "expected an error saying {says:?}, got {error:?}");
    }

    #[test]
    fn a_well_formed_entity_expands() {
        let item = quote! {
            impl Entity for Counter {
                fn new(_id: &EntityId) -> Self { Counter { n: 0 } }
                #[message] async fn add(&mut self, ctx: &mut EntityContext, by: i64) -> i64 { by }
                #[message] fn get(&self) -> i64 { self.n }
            }
        };
        let out =
            try_expand(&MESSAGES, TokenStream::new(), item).map(|t| t.to_string()).unwrap_or_else(|e| e.to_string());
        for part in [
            "struct Add { # [allow (missing_docs)] by : i64 }",
            "struct Get ;",
            "impl :: shardline :: Request < CounterMessage , CounterReply > for Add",
            "enum CounterMessage",
            "type Message = CounterMessage",
            "CounterMessage :: Add (Add { by }) => CounterReply :: Add (Self :: add (self , ctx , by) . await)",
            "CounterMessage :: Get (Get) => CounterReply :: Get (Self :: get (self ,))",
        ] {
            assert!(out.contains(part), "{part:?} is not in the expansion:\n{out}");
        }
        assert!(!out.contains("# [message]"), "the marker attribute stays out of the expansion:\n{out}");
        assert!(!out.contains("pub "), "private unless asked:\n{out}");
        let public =
            try_expand(&MESSAGES, quote!(pub(crate)), quote!(impl Entity for C { #[message] fn a(&self, n: u8) {} }));
        let public = public.map(|t| t.to_string()).unwrap_or_else(|e| e.to_string());
        assert!(public.contains("pub (crate) struct A { # [allow (missing_docs)] pub (crate) n : u8 }"), "{public}");
    }

    #[test]
    fn misuse_is_an_error_that_says_what_to_change() {
        refused(
            &MESSAGES,
            quote!(impl Actor for C { #[message] fn a(&self) {} }),
            "put #[messages] on `impl Entity for YourType`",
        );
        refused(
            &MESSAGES,
            quote!(
                impl<T> Entity for C<T> {
                    #[message]
                    fn a(&self) {}
                }
            ),
            "a generic Entity",
        );
        refused(&MESSAGES, quote!(impl Entity for C { fn new(_: &EntityId) -> Self { C } }), "no #[message] method");
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn new(&self) {} }), "`new` is a method of Entity");
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn a(&self, s: &str) {} }), "take an owned value");
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn a(&self, (x, y): (u8, u8)) {} }),
            "name the argument",
        );
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn a(x: u8) {} }), "takes `&self`");
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn a(self) {} }), "takes `&self` or `&mut self`");
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn a<T>(&self, t: T) {} }), "cannot be generic");
        refused(
            &MESSAGES,
            quote!(impl Entity for C { type Reply = u8; #[message] fn a(&self) {} }),
            "writes `type Reply`",
        );
        refused(
            &MESSAGES,
            quote!(impl Entity for C { async fn handle(&mut self) {} #[message] fn a(&self) {} }),
            "writes `handle`",
        );
        refused(&MESSAGES, quote!(impl Entity for C { #[message] unsafe fn a(&self) {} }), "cannot be `unsafe`");
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn a<'x>(&'x self) {} }),
            "cannot be generic or name lifetimes",
        );
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn a(&self, n: impl Into<u8>) {} }),
            "not `impl Trait`",
        );
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn a(&self) -> impl Send {} }), "not `impl Trait`");
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn a(&self, #[cfg(x)] n: u8) {} }),
            "put them on the method",
        );
        refused(&MESSAGES, quote!(impl Entity for C { #[message] fn __(&self) {} }), "makes no type name");
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn status(&self) -> Status { todo!() } }),
            "would shadow the type `Status`",
        );
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn get(&self) {} #[message] fn get_(&self) {} }),
            "both make the request `Get`",
        );
        refused(
            &MESSAGES,
            quote!(impl Entity for C { #[message(title = "X")] fn a(&self) {} }),
            "the one setting is `name",
        );
        let renamed = try_expand(
            &MESSAGES,
            TokenStream::new(),
            quote!(impl Entity for C { #[message(name = "GetStatus")] fn status(&self) -> Status { todo!() } }),
        );
        let renamed = renamed.map(|t| t.to_string()).unwrap_or_else(|e| e.to_string());
        assert!(
            renamed.contains("struct GetStatus ;")
                && renamed
                    .contains("CMessage :: GetStatus (GetStatus) => CReply :: GetStatus (Self :: status (self ,))"),
            "{renamed}"
        );
        // Every bad handler is reported, not only the first.
        let both = error_of(
            &MESSAGES,
            quote!(impl Entity for C { #[message] fn new(&self) {} #[message] fn b(&self, s: &str) {} }),
        );
        assert!(both.contains("`new`") && both.contains("owned value"), "{both}");
    }

    #[test]
    fn a_conditional_handler_is_conditional_everywhere() {
        let item =
            quote!(impl Entity for C { #[message] #[cfg(feature = "x")] fn a(&self) {} #[message] fn b(&self) {} });
        let out =
            try_expand(&MESSAGES, TokenStream::new(), item).map(|t| t.to_string()).unwrap_or_else(|e| e.to_string());
        let cfg = "# [cfg (feature = \"x\")]";
        // The struct, its Request impl, its two variants, its arm and the method: six places.
        assert_eq!(out.matches(cfg).count(), 6, "{out}");
        for under in [
            "# [cfg (feature = \"x\")] impl :: shardline :: Request < CMessage , CReply > for A",
            "# [cfg (feature = \"x\")] # [allow (missing_docs)] A (A)",
            "# [cfg (feature = \"x\")] # [allow (missing_docs)] A (())",
            "# [cfg (feature = \"x\")] CMessage :: A (A) =>",
            "# [cfg (feature = \"x\")] fn a (& self)",
        ] {
            assert!(out.contains(under), "{under:?} is not in the expansion:\n{out}");
        }
    }

    #[test]
    fn a_command_decides_on_its_state_alone() {
        refused(
            &COMMANDS,
            quote!(impl EventSourced for C { #[command] fn a(&mut self) -> (Vec<E>, u8) { todo!() } }),
            "a command takes `&self`",
        );
        refused(
            &COMMANDS,
            quote!(impl EventSourced for C { #[command] async fn a(&self) -> (Vec<E>, u8) { todo!() } }),
            "decided synchronously",
        );
        refused(
            &COMMANDS,
            quote!(impl EventSourced for C { #[command] fn a(&self, ctx: &EntityContext) -> (Vec<E>, u8) { todo!() } }),
            "takes no context",
        );
        refused(
            &COMMANDS,
            quote!(impl EventSourced for C { #[command] fn a(&self) -> u8 { 1 } }),
            "returns `(Vec<Self::Event>, Reply)`",
        );
        refused(
            &COMMANDS,
            quote!(impl EventSourced for C { #[command] fn apply(&self) -> (Vec<E>, u8) { todo!() } }),
            "`apply` is a method of EventSourced",
        );
        refused(
            &COMMANDS,
            quote!(impl EventSourced for C { fn decide(&self, c: X) -> (Vec<E>, u8) { todo!() } #[command] fn a(&self) -> (Vec<E>, u8) { todo!() } }),
            "writes `decide`",
        );
        let ok = error_of(
            &COMMANDS,
            quote!(impl EventSourced for C { #[command] fn a(&self, n: u8) -> (Vec<E>, u8) { (vec![], n) } }),
        );
        assert_eq!(ok, "");
    }
}

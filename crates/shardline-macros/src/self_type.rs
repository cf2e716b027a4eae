//! `Self` in what the attributes move out of the trait's impl.
//!
//! A handler moves to an inherent `impl T`, where `Self::Event` no longer resolves (an
//! associated type of a trait needs the trait named); its argument and reply types move further,
//! into a request struct and the enums, where `Self` would name the struct. So the handler's
//! `Self::Event` becomes `<Self as ::shardline::EventSourced>::Event`, and in the moved types every
//! `Self` becomes the entity's type.

use proc_macro2::{Group, Punct, Spacing, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::Type;

use crate::kind::Kind;

/// `tokens` with `Self::X` (an associated type of `kind`'s trait) spelled through the trait and,
/// when `outside` is given, every `Self` as that type.
pub fn rewrite(kind: &Kind, tokens: TokenStream, outside: Option<&Type>) -> TokenStream {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = TokenStream::new();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Ident(id) if id == "Self" => {
                let this = outside.map_or_else(|| quote!(Self), |t| t.to_token_stream());
                match associated(kind, &trees[i + 1..]) {
                    Some(assoc) => {
                        let trait_path = kind.trait_path();
                        out.extend(quote!(<#this as #trait_path>::#assoc));
                        i += 4;
                        continue;
                    }
                    None => out.extend(this),
                }
            }
            TokenTree::Group(g) => {
                let mut inner = Group::new(g.delimiter(), rewrite(kind, g.stream(), outside));
                inner.set_span(g.span());
                out.extend([TokenTree::Group(inner)]);
            }
            other => out.extend([other.clone()]),
        }
        i += 1;
    }
    out
}

/// The associated type named by `:: X` at the start of `rest`, if X is one of the trait's.
fn associated(kind: &Kind, rest: &[TokenTree]) -> Option<TokenTree> {
    let [TokenTree::Punct(a), TokenTree::Punct(b), TokenTree::Ident(x), ..] = rest else { return None };
    let colons = |p: &Punct, spacing| p.as_char() == ':' && p.spacing() == spacing;
    (colons(a, Spacing::Joint) && colons(b, Spacing::Alone) && kind.associated_types.iter().any(|t| x == t))
        .then(|| TokenTree::Ident(x.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::{COMMANDS, MESSAGES};

    #[test]
    fn associated_types_go_through_the_trait_and_self_is_the_entity_outside() {
        let handler = quote!(
            fn a(&self) -> (Vec<Self::Event>, Option<Self>) {
                Self::helper();
                let e: Self::Event = todo!();
            }
        );
        let moved = rewrite(&COMMANDS, handler, None).to_string();
        assert!(moved.contains("Vec < < Self as :: shardline :: EventSourced > :: Event >"), "{moved}");
        assert!(moved.contains("let e : < Self as :: shardline :: EventSourced > :: Event"), "{moved}");
        assert!(moved.contains("Self :: helper ()"), "a method of the type stays: {moved}");
        assert!(moved.contains("Option < Self >"), "{moved}");

        let cart: Type = syn::parse_quote!(Cart);
        let field = rewrite(&COMMANDS, quote!(Vec<(Self, Self::Event)>), Some(&cart)).to_string();
        assert_eq!(field, "Vec < (Cart , < Cart as :: shardline :: EventSourced > :: Event) >");
        let entity = rewrite(&MESSAGES, quote!(Self::Reply), Some(&cart)).to_string();
        assert_eq!(entity, "< Cart as :: shardline :: Entity > :: Reply");
        assert_eq!(rewrite(&MESSAGES, quote!(Self::Event), None).to_string(), "Self :: Event", "not Entity's");
    }
}

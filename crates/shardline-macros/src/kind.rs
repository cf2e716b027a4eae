//! What differs between the two attributes: the trait they implement, its names, and what a
//! handler of it may take and must return.

use syn::Type;

/// `#[messages]` on `impl Entity`, or `#[commands]` on `impl EventSourced`.
pub struct Kind {
    /// The trait the attribute completes.
    pub trait_name: &'static str,
    /// The attribute that marks a handler.
    pub marker: &'static str,
    /// The trait's associated type of what it receives (and the message enum's suffix).
    pub message_type: &'static str,
    /// The trait's methods: a handler may not take their names.
    pub reserved: &'static [&'static str],
    /// The trait's associated types, which a handler names as `Self::X`.
    pub associated_types: &'static [&'static str],
    /// Whether a handler may be `async`.
    pub async_allowed: bool,
    /// Whether a handler may take `&mut self`.
    pub mut_self_allowed: bool,
    /// Whether a handler may take the entity's context.
    pub context_allowed: bool,
}

/// An [`Entity`]'s messages: a handler is `async` or not, takes `&self` or `&mut self` and the
/// context if it wants it, and returns its reply.
pub const MESSAGES: Kind = Kind {
    trait_name: "Entity",
    marker: "message",
    message_type: "Message",
    reserved: &["new", "handle", "started", "stopped", "hand_over", "take_over", "reminded"],
    associated_types: &["Message", "Reply"],
    async_allowed: true,
    mut_self_allowed: true,
    context_allowed: true,
};

/// An `EventSourced` type's commands: a handler decides on `&self`, synchronously, and returns
/// the events and the reply, as `decide` does.
pub const COMMANDS: Kind = Kind {
    trait_name: "EventSourced",
    marker: "command",
    message_type: "Command",
    reserved: &[
        "empty",
        "apply",
        "decide",
        "decide_with",
        "upcast",
        "decide_without_state",
        "reminders",
        "on_reminder",
    ],
    associated_types: &["Command", "Event", "Reply"],
    async_allowed: false,
    mut_self_allowed: false,
    context_allowed: false,
};

impl Kind {
    /// The trait, by its full path.
    pub fn trait_path(&self) -> proc_macro2::TokenStream {
        let name = quote::format_ident!("{}", self.trait_name);
        quote::quote!(::shardline::#name)
    }

    /// The trait method the attribute writes: it sends each request to its handler.
    pub fn dispatch(&self) -> &'static str {
        if self.context_allowed {
            "handle"
        } else {
            "decide"
        }
    }

    /// The reply in what a handler returns: all of it for a message, the second of
    /// `(events, reply)` for a command (None: not such a pair).
    pub fn reply_of(&self, returned: &Type) -> Option<Type> {
        if self.message_type == "Message" {
            return Some(returned.clone());
        }
        match returned {
            Type::Tuple(t) if t.elems.len() == 2 => t.elems.iter().nth(1).cloned(),
            Type::Paren(p) => self.reply_of(&p.elem),
            _ => None,
        }
    }
}

//! [`Request`]: one message of an entity's protocol with a reply type of its own, as Orleans'
//! typed grain methods give.
//!
//! An entity receives one message type and answers one reply type, because that is what
//! travels: one enum each way, encoded once. A caller should not have to match the whole reply
//! enum to read the answer to `Get`, so a request names the variant it becomes and the variant
//! it is answered with, and [`EntityRef::ask`](crate::EntityRef::ask) returns that variant's
//! content. Every message is a request answered with the whole reply (the blanket
//! implementation), so entities written by hand work unchanged; [`messages`](crate::messages)
//! and [`commands`](crate::commands) write the enums and one request type per handler.

/// A request to an entity whose messages are `M` and replies `R`: what it becomes on the way in
/// and what its answer is on the way out.
///
/// ```
/// use shardline::Request;
///
/// enum Msg { Add(u64), Get }
/// enum Reply { Added, Total(u64) }
///
/// /// Read the total.
/// struct Get;
///
/// impl Request<Msg, Reply> for Get {
///     type Reply = u64;
///     fn into_message(self) -> Msg { Msg::Get }
///     fn from_reply(reply: Reply) -> Result<u64, Reply> {
///         match reply { Reply::Total(n) => Ok(n), other => Err(other) }
///     }
/// }
///
/// assert!(matches!(Get.into_message(), Msg::Get));
/// assert_eq!(<Get as Request<Msg, Reply>>::from_reply(Reply::Total(7)).ok(), Some(7));
/// assert!(<Get as Request<Msg, Reply>>::from_reply(Reply::Added).is_err());
/// // Any message is a request answered with the whole reply.
/// assert!(matches!(<Msg as Request<Msg, Reply>>::from_reply(Reply::Added), Ok(Reply::Added)));
/// ```
pub trait Request<M, R>: Sized {
    /// What the entity answers to this request.
    type Reply;

    /// The request as the entity's message.
    fn into_message(self) -> M;

    /// This request's answer out of the entity's reply; the reply back when it answers another
    /// request (an entity that answered with the wrong variant: the caller gets
    /// [`Error::ReplyLost`](crate::Error::ReplyLost), since the message was processed).
    fn from_reply(reply: R) -> Result<Self::Reply, R>;
}

impl<M, R> Request<M, R> for M {
    type Reply = R;

    fn into_message(self) -> M {
        self
    }

    fn from_reply(reply: R) -> Result<R, R> {
        Ok(reply)
    }
}

/// The answer to `Q` out of `reply`, or `ReplyLost` naming the entity type.
pub(crate) fn answer<Q: Request<M, R>, M, R>(
    type_key: &impl std::fmt::Display,
    reply: R,
) -> Result<Q::Reply, crate::Error> {
    Q::from_reply(reply).map_err(|_| {
        crate::Error::ReplyLost(format!(
            "an entity of type {type_key} answered {} with another request's reply",
            std::any::type_name::<Q>()
        ))
    })
}

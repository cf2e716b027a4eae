//! The state a shard's entities hand its next owner on a planned move.

/// Each entity's id and its encoded state (what `Entity::hand_over` returned).
pub type HandedOver = Vec<(String, Vec<u8>)>;

/// Encodes what a stopping shard hands over; None when no entity handed anything.
///
/// ```
/// use shardline_core::host::{decode_handover, encode_handover};
///
/// assert_eq!(encode_handover(&[]), None);
/// let bytes = encode_handover(&[("a".into(), vec![1, 2])]).unwrap();
/// assert_eq!(decode_handover(&bytes).unwrap(), vec![("a".to_string(), vec![1, 2])]);
/// ```
pub fn encode_handover(handed: &[(String, Vec<u8>)]) -> Option<Vec<u8>> {
    if handed.is_empty() {
        return None;
    }
    postcard::to_allocvec(handed).ok()
}

/// Decodes what the previous owner handed over.
pub fn decode_handover(data: &[u8]) -> Result<HandedOver, postcard::Error> {
    postcard::from_bytes(data)
}

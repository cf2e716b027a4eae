//! Views that arrive while the coordinator's node may not act: kept, and handled first once it
//! may.

use super::engine::CoordinatorEngine;
use crate::membership::MembershipView;

impl CoordinatorEngine {
    /// A view that arrived while this node may not act as coordinator (its hosting lease ran out
    /// or is not granted yet, so the driver hands it no input): only the newest is kept, and
    /// [`apply_held_view`](Self::apply_held_view) handles it before the next input once the node
    /// may act; acted on before it, that input would be decided on an older view.
    pub fn hold_view(&mut self, view: &MembershipView) {
        match self.loading.as_mut() {
            Some(l) => l.view = view.clone(),
            None => self.held_view = Some(view.clone()),
        }
    }

    /// Handles the view [`hold_view`](Self::hold_view) kept, if any: the driver's first step of
    /// every input.
    pub fn apply_held_view(&mut self, now: u64) {
        if let Some(view) = self.held_view.take() {
            self.handle_membership(now, &view);
        }
    }
}

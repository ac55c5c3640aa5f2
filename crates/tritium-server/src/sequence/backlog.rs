//! The sequence batcher's backlog: the sequences waiting for a slot, oldest first, indexed by
//! correlation id (the open ones) and by expiry, so that a push, a release and a reap cost a
//! logarithm.

use super::*;

/// A sequence waiting for a slot.
pub(super) struct Waiting {
    pub(super) key: Key,
    /// Its END has not come yet: later requests of the sequence join it.
    pub(super) open: bool,
    pub(super) requests: VecDeque<Pending>,
    /// The earliest `timeout` of its requests.
    pub(super) expires: Option<Instant>,
}

/// The sequences waiting for a slot, oldest first, indexed by correlation id (the open ones)
/// and by expiry.
#[derive(Default)]
pub(super) struct Backlog {
    /// The next arrival number.
    pub(super) next: u64,
    /// By arrival.
    pub(super) waiting: BTreeMap<u64, Waiting>,
    /// The open sequence of each key (at most one: a new START joins it).
    pub(super) open: HashMap<Key, u64>,
    /// Sequences with a deadline, soonest first.
    pub(super) expiries: BTreeSet<(Instant, u64)>,
    /// Requests in `waiting`.
    pub(super) requests: usize,
}

impl Backlog {
    /// Sequences waiting.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// The open sequence `key`, if it is waiting here.
    pub(super) fn open_of(&self, key: &Key) -> Option<u64> {
        self.open.get(key).copied()
    }

    /// A new sequence, oldest-last.
    pub(super) fn push(&mut self, key: Key, open: bool, p: Pending, expires: Option<Instant>) {
        let n = self.next;
        self.next += 1;
        if open {
            self.open.insert(key.clone(), n);
        }
        if let Some(e) = expires {
            self.expiries.insert((e, n));
        }
        self.requests += 1;
        self.waiting.insert(n, Waiting { key, open, requests: VecDeque::from([p]), expires });
    }

    /// A later request of waiting sequence `n`; `end` closes it.
    pub(super) fn join(&mut self, n: u64, p: Pending, end: bool, expires: Option<Instant>) {
        let Some(w) = self.waiting.get_mut(&n) else { return };
        let earliest = match (w.expires, expires) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if earliest != w.expires {
            if let Some(old) = w.expires {
                self.expiries.remove(&(old, n));
            }
            if let Some(e) = earliest {
                self.expiries.insert((e, n));
            }
            w.expires = earliest;
        }
        w.requests.push_back(p);
        self.requests += 1;
        if end && w.open {
            w.open = false;
            self.open.remove(&w.key);
        }
    }

    /// Removes waiting sequence `n` from every index.
    pub(super) fn remove(&mut self, n: u64) -> Option<Waiting> {
        let w = self.waiting.remove(&n)?;
        if w.open && self.open.get(&w.key) == Some(&n) {
            self.open.remove(&w.key);
        }
        if let Some(e) = w.expires {
            self.expiries.remove(&(e, n));
        }
        self.requests -= w.requests.len();
        Some(w)
    }

    /// The oldest waiting sequence.
    pub(super) fn pop_front(&mut self) -> Option<Waiting> {
        let (&n, _) = self.waiting.first_key_value()?;
        self.remove(n)
    }

    /// The sequences one of whose requests' `timeout` passed by `now`.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<Waiting> {
        let mut expired = Vec::new();
        while let Some(&(e, n)) = self.expiries.first() {
            if e > now {
                break;
            }
            self.expiries.remove(&(e, n));
            expired.extend(self.remove(n));
        }
        expired
    }

    /// Every waiting sequence, oldest first; the backlog is empty after.
    pub(super) fn drain(&mut self) -> Vec<Waiting> {
        let all = std::mem::take(&mut self.waiting).into_values().collect();
        *self = Backlog { next: self.next, ..Backlog::default() };
        all
    }
}

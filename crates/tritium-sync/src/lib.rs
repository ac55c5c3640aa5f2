//! Locks taken whatever a panicking holder left behind: the one way every tritium crate (the
//! stub's native module too) takes a `Mutex` or an `RwLock`. A thread that panicked while holding
//! one of the server's locks (model code never runs under them; a bug in the server could) left
//! its data consistent enough to go on with, and refusing every later caller would take the
//! whole server, or the whole stub, down with that one thread. A leaf crate: it depends on no
//! other crate, so that every layer, `tritium-ipc` included, can use it.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`], taking the guard of a poisoned lock as it is.
pub trait Locked<T: ?Sized> {
    /// The guard, once the lock is free.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], taking the guard of a poisoned lock as it is.
pub trait RwLocked<T: ?Sized> {
    /// The shared guard, once no writer holds the lock.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// The exclusive guard, once the lock is free.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panicking_holder_is_taken_with_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let rw = std::sync::Arc::new(RwLock::new(2));
        let (m2, rw2) = (m.clone(), rw.clone());
        let panicked = std::thread::spawn(move || {
            let mut a = m2.locked();
            let mut b = rw2.write_locked();
            *a += 10;
            *b += 20;
            panic!("a holder panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned() && rw.is_poisoned());
        assert_eq!(*m.locked(), 11);
        assert_eq!(*rw.read_locked(), 22);
        *rw.write_locked() = 3;
        assert_eq!(*rw.read_locked(), 3);
    }
}

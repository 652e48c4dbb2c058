//! Locks used as if never poisoned. A lock is poisoned when a thread
//! panicked holding it; every holder in sless writes whole values under
//! its locks, so what a poisoned lock guards is still consistent, and the
//! process serves on rather than panicking in turn.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub trait Unpoisoned<T: ?Sized> {
    type Read<'a>
    where
        Self: 'a;
    type Write<'a>
    where
        Self: 'a;

    /// Takes the lock (for writing, on an `RwLock`), poisoned or not.
    fn lock_unpoisoned(&self) -> Self::Write<'_>;
    /// Takes the lock for reading (a `Mutex` has only the one way).
    fn read_unpoisoned(&self) -> Self::Read<'_>;
}

impl<T: ?Sized> Unpoisoned<T> for Mutex<T> {
    type Read<'a>
        = MutexGuard<'a, T>
    where
        T: 'a;
    type Write<'a>
        = MutexGuard<'a, T>
    where
        T: 'a;

    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock_unpoisoned()
    }
}

impl<T: ?Sized> Unpoisoned<T> for RwLock<T> {
    type Read<'a>
        = RwLockReadGuard<'a, T>
    where
        T: 'a;
    type Write<'a>
        = RwLockWriteGuard<'a, T>
    where
        T: 'a;

    fn lock_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_a_panic_poisoned_is_still_taken() {
        let shared = std::sync::Arc::new((Mutex::new(1), RwLock::new(2)));
        let held = shared.clone();
        let _ = std::thread::spawn(move || {
            let _m = held.0.lock().unwrap();
            let _w = held.1.write().unwrap();
            panic!("a holder panics");
        })
        .join();
        assert!(shared.0.is_poisoned() && shared.1.is_poisoned());
        *shared.0.lock_unpoisoned() += 1;
        *shared.1.lock_unpoisoned() += 1;
        assert_eq!((*shared.0.read_unpoisoned(), *shared.1.read_unpoisoned()), (2, 3));
    }
}

//! `SessionSlots`: what the layers above the sandbox keep for as long as a session lives,
//! one value per type (the tools' state in `tools::session`, the conversation in
//! `agent::session_run`). The session stays ignorant of those types; each layer finds its
//! own value by type, created on first use.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct SessionSlots {
    values: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl SessionSlots {
    /// The session's `T`, made by `make` the first time it is asked for.
    pub fn get_or_insert_with<T, F>(&self, make: F) -> Arc<T>
    where
        T: Any + Send + Sync,
        F: FnOnce() -> T,
    {
        let mut values = match self.values.lock() {
            Ok(v) => v,
            // A panic while holding this lock cannot leave a half-made entry: insert is
            // the last step. Carry on with what is there.
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(v) = values
            .get(&TypeId::of::<T>())
            .and_then(|v| v.clone().downcast::<T>().ok())
        {
            return v;
        }
        let v = Arc::new(make());
        values.insert(TypeId::of::<T>(), v.clone());
        v
    }

    /// The session's `T`, if something made it. Not from inside a `make` of
    /// `get_or_insert_with` (the lock is held there, and is not reentrant).
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let values = match self.values.lock() {
            Ok(v) => v,
            Err(poisoned) => poisoned.into_inner(),
        };
        values
            .get(&TypeId::of::<T>())
            .and_then(|v| v.clone().downcast::<T>().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_per_type_made_once() {
        let slots = SessionSlots::default();
        let a = slots.get_or_insert_with(|| 41_u32);
        let b = slots.get_or_insert_with(|| 7_u32);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*b, 41);
        let s = slots.get_or_insert_with(|| String::from("x"));
        assert_eq!(s.as_str(), "x");
    }
}

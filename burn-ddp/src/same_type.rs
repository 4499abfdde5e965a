//! Moving a value to the type it already is, decided at run time: a backend's tensors and
//! devices as burn-cuda's once the backend is known to be burn-cuda. A leaf module: every
//! layer imports it.

/// `from` as `To` when they are the same type, else `from` back. Moves the value without
/// allocating: every burn-cuda layer and DDP bucket casts its tensors this way, each step.
pub(crate) fn cast<From: 'static, To: 'static>(from: From) -> std::result::Result<To, From> {
    let mut slot = Some(from);
    match (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<To>>() {
        Some(to) => Ok(to.take().expect("filled above")),
        None => Err(slot.take().expect("left as it was")),
    }
}

#[cfg(test)]
mod tests {
    use super::cast;

    #[test]
    fn cast_moves_a_value_to_its_own_type_and_gives_another_type_back() {
        let v = vec![1.5f32, 2.5];
        assert_eq!(cast::<Vec<f32>, Vec<f32>>(v.clone()), Ok(v.clone()));
        assert_eq!(cast::<Vec<f32>, Vec<f64>>(v.clone()), Err(v));
        assert_eq!(cast::<String, u8>("kept".to_string()), Err("kept".to_string()));
    }
}

//! FSDP's reshard after forward without recompute (torch FSDP's `reshard_after_forward`): a
//! stage's gathered unit parameters are dropped once its forward is done and given again (a new
//! all-gather) just before its backward, while the graph between the two holds no reference to
//! them. A unit's parameters are views of one flat buffer; `Resharded` registers the buffers of
//! a stage's units before its forward, and a kernel that keeps a parameter for its backward
//! (`Kept::of`: the linear layer's weight, a norm's scale) keeps the unit's slot and the view's
//! layout instead of the view when its buffer is registered. After the forward `release` empties
//! the slots (and `hollow` leaves the module's parameters without their values), so the buffers
//! are freed; `refill` hands the slots the gathered buffers again for the backward, where each
//! kept view is rebuilt over them. Nothing else in the fused path keeps a parameter (the
//! embedding's backward needs only the ids), so the peak holds the shards, the stages gathered
//! at the moment and the activations, as torch's does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_flex::{FlexTensor, Layout};

use super::route::{self, AdTensor, Routes};

/// A unit's flat buffer, while it is dropped or back.
#[derive(Debug)]
pub struct Slot {
    /// The buffer's start in its storage when registered (views are laid out from it).
    base: usize,
    len: usize,
    unit: Mutex<Option<FlexTensor>>,
}

/// The registered buffers, by the address of their storage (alive while registered, so no
/// other tensor can have it).
fn registry() -> &'static Mutex<HashMap<usize, Arc<Slot>>> {
    static SLOTS: OnceLock<Mutex<HashMap<usize, Arc<Slot>>>> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn key(t: &FlexTensor) -> usize {
    Arc::as_ptr(&t.data_arc()) as *const () as usize
}

/// A parameter as a kernel keeps it for its backward.
#[derive(Debug, Clone)]
pub(super) enum Kept {
    /// The view itself.
    Held(FlexTensor),
    /// The view's layout over its unit's buffer, which is dropped meanwhile.
    Dropped {
        slot: Arc<Slot>,
        layout: Layout,
        dtype: DType,
    },
}

impl Kept {
    /// `t` as a kernel keeps it: through its unit's slot when its buffer is registered.
    pub fn of(t: &FlexTensor) -> Kept {
        match lock(registry()).get(&key(t)) {
            Some(slot) => Kept::Dropped {
                slot: slot.clone(),
                layout: t.layout().clone(),
                dtype: t.dtype(),
            },
            None => Kept::Held(t.clone()),
        }
    }

    /// The view again (over the buffer `Resharded::refill` gave its slot).
    ///
    /// # Panics
    /// When the slot was not refilled before the backward (the engine refills a resharded
    /// stage's units before it runs the stage's backward).
    pub fn get(&self) -> FlexTensor {
        match self {
            Kept::Held(t) => t.clone(),
            Kept::Dropped {
                slot,
                layout,
                dtype,
            } => {
                let unit = lock(&slot.unit);
                let unit = unit.as_ref().expect(
                    "a resharded unit's parameters were not gathered again before its backward",
                );
                let at = layout.start_offset() - slot.base + unit.layout().start_offset();
                let layout = Layout::new(layout.shape().clone(), layout.strides().to_vec(), at);
                FlexTensor::from_arc(unit.data_arc(), layout, *dtype)
            }
        }
    }
}

/// The units of one stage whose gathered parameters are dropped after its forward; they leave
/// the registry when released or dropped.
#[derive(Debug, Default)]
pub struct Resharded {
    slots: Vec<(usize, Arc<Slot>)>,
}

impl Resharded {
    /// Registers unit buffer `unit` (flat, contiguous) before the forward: kernels keep its
    /// views through its slot. False (nothing registered) where it is not a flex tensor.
    pub fn add<I: Backend>(&mut self, unit: &Tensor<I, 1>) -> bool {
        let Some(f) = flex_of(unit) else {
            return false;
        };
        if !f.layout().is_contiguous() {
            return false;
        }
        let slot = Arc::new(Slot {
            base: f.layout().start_offset(),
            len: f.layout().num_elements(),
            unit: Mutex::new(Some(f.clone())),
        });
        let k = key(&f);
        lock(registry()).insert(k, slot.clone());
        self.slots.push((k, slot));
        true
    }

    /// Whether any unit was registered.
    pub fn any(&self) -> bool {
        !self.slots.is_empty()
    }

    /// After the forward: the buffers leave the registry and their slots, so that they are
    /// freed once the module lets go of them (`hollow`).
    pub fn release(&self) {
        let mut r = lock(registry());
        for (k, slot) in &self.slots {
            // (only this stage's own entry: released again after the backward, the address
            // may be another rank's buffer by then)
            if r.get(k).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                r.remove(k);
            }
            *lock(&slot.unit) = None;
        }
    }

    /// Before the backward: the units' buffers again, in the order they were added. An error
    /// names a buffer of another length.
    pub fn refill<I: Backend>(&self, units: Vec<Tensor<I, 1>>) -> Result<(), String> {
        if units.len() != self.slots.len() {
            return Err(format!(
                "{} resharded units were given back {} buffers",
                self.slots.len(),
                units.len()
            ));
        }
        for ((_, slot), u) in self.slots.iter().zip(units) {
            let f = flex_of(&u)
                .filter(|f| f.layout().is_contiguous())
                .ok_or("a resharded unit came back in another form")?;
            if f.layout().num_elements() != slot.len {
                return Err(format!(
                    "a resharded unit of {} values came back with {}",
                    slot.len,
                    f.layout().num_elements()
                ));
            }
            *lock(&slot.unit) = Some(f);
        }
        Ok(())
    }
}

impl Drop for Resharded {
    fn drop(&mut self) {
        let mut r = lock(registry());
        for (k, slot) in &self.slots {
            // (only this stage's own entry: a later buffer may have the address by now)
            if r.get(k).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                r.remove(k);
            }
        }
    }
}

/// The flex tensor of `t` (shared, not copied), when its backend is flex.
pub(super) fn flex_of<I: Backend>(t: &Tensor<I, 1>) -> Option<FlexTensor> {
    match route::route1(t.clone()).ok()? {
        Routes::Plain([f]) => Some(f),
        Routes::Autodiff([a]) => Some(a.primitive),
    }
}

/// `t` without its values: the same node of the graph (its gradient is still found by it) over
/// one zero, so a module that must outlive its stage's forward holds no parameter buffer.
/// Unchanged where the backend is not flex.
pub fn hollow<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    let empty = |p: &FlexTensor| {
        let one = FlexTensor::from_data(burn::tensor::TensorData::new(vec![0f32], [1]));
        let shape = p.layout().shape().clone();
        let layout = Layout::new(shape, vec![0; p.layout().num_dims()], 0);
        FlexTensor::from_arc(one.data_arc(), layout, p.dtype())
    };
    match route::route1(t) {
        Ok(Routes::Autodiff([a])) => {
            let h = AdTensor {
                primitive: empty(&a.primitive),
                node: a.node,
                rc: a.rc,
            };
            route::back::<B, _, D>(h).expect("routed to flex with autodiff")
        }
        Ok(Routes::Plain([f])) => {
            let h = empty(&f);
            route::back::<B, _, D>(h).expect("routed to flex")
        }
        Err(t) => t,
    }
}

/// The parameter of `shape` at `start` in unit buffer `unit` (flat, contiguous) as a view of
/// the buffer, not a copy (flex copies a reshaped slice that does not start at 0): every
/// parameter of a unit then shares its buffer, which `Resharded` can drop as one. `None` where
/// the backend is not flex or the view would not fit.
pub fn param_view<I: Backend, const D: usize>(
    unit: &Tensor<I, 1>,
    start: usize,
    shape: [usize; D],
) -> Option<Tensor<I, D>> {
    let f = flex_of(unit)?;
    let len: usize = shape.iter().product();
    if !f.layout().is_contiguous() || start + len > f.layout().num_elements() {
        return None;
    }
    let mut strides = vec![1isize; D];
    for d in (0..D.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1] as isize;
    }
    let at = f.layout().start_offset() + start;
    let layout = Layout::new(burn::tensor::Shape::from(shape.to_vec()), strides, at);
    let view = FlexTensor::from_arc(f.data_arc(), layout, f.dtype());
    match route::route1(unit.clone()).ok()? {
        Routes::Plain(_) => route::back::<I, _, D>(view),
        Routes::Autodiff(_) => None,
    }
}

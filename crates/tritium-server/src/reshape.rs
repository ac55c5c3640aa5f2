//! The `reshape` of a model's inputs and outputs, applied as Triton applies it: an input reaches
//! the model in its `reshape` shape (`InferenceRequest::Normalize`), and an output the model
//! produces in its `reshape` shape goes to the client in its `dims` shape
//! (`InferenceResponse::Output::Reshape`). The batch dimension of a batching model stays first
//! and untouched; a `-1` of the target shape takes, in order, the sizes at the `-1`s of the
//! source shape.

use std::collections::HashMap;

use tritium_config::ModelConfig;

/// The reshapes of one model version's inputs and outputs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reshapes {
    /// Input name to (`dims`, `reshape`), for inputs with a reshape (shape tensors excepted:
    /// they have no batch dimension).
    inputs: HashMap<String, Plan>,
    /// Output name to (`reshape`, `dims`), for outputs with a reshape.
    outputs: HashMap<String, Plan>,
}

/// A shape rewrite: from the shape `from` describes to the one `to` describes.
#[derive(Debug, Clone)]
struct Plan {
    from: Vec<i64>,
    to: Vec<i64>,
    /// Whether the tensor has a batch dimension (before `from`'s dimensions).
    batched: bool,
}

impl Reshapes {
    /// The reshapes `config` declares.
    pub(crate) fn new(config: &ModelConfig) -> Self {
        let batching = config.max_batch_size > 0;
        let inputs = config
            .input
            .iter()
            .filter_map(|i| {
                let r = i.reshape.as_ref()?;
                let batched = batching && !i.is_shape_tensor;
                Some((i.name.clone(), Plan { from: i.dims.clone(), to: r.shape.clone(), batched }))
            })
            .collect();
        let outputs = config
            .output
            .iter()
            .filter_map(|o| {
                let r = o.reshape.as_ref()?;
                Some((o.name.clone(), Plan { from: r.shape.clone(), to: o.dims.clone(), batched: batching }))
            })
            .collect();
        Self { inputs, outputs }
    }

    /// The shape the model sees for input `name` sent with `shape` (already validated against
    /// the input's `dims`).
    pub(crate) fn input(&self, name: &str, shape: &mut Vec<i64>) {
        if let Some(plan) = self.inputs.get(name) {
            plan.apply(shape);
        }
    }

    /// The shape the client gets for output `name` the model produced with `shape`. An output
    /// whose shape does not fit its `reshape` (another rank, another element count) keeps its
    /// shape: Triton would describe bytes it does not have.
    pub(crate) fn output(&self, name: &str, shape: &mut Vec<i64>) {
        if let Some(plan) = self.outputs.get(name) {
            plan.apply(shape);
        }
    }
}

impl Plan {
    fn apply(&self, shape: &mut Vec<i64>) {
        if let Some(reshaped) = self.reshaped(shape) {
            *shape = reshaped;
        }
    }

    /// `shape` rewritten, or `None` when it does not fit `from` (rank, or element count).
    fn reshaped(&self, shape: &[i64]) -> Option<Vec<i64>> {
        let (batch, item) = match (self.batched, shape.split_first()) {
            (true, Some((b, rest))) => (Some(*b), rest),
            (true, None) => return None,
            (false, _) => (None, shape),
        };
        if item.len() != self.from.len() {
            return None;
        }
        let mut variable = self.from.iter().zip(item).filter(|(f, _)| **f == -1).map(|(_, &d)| d);
        let mut out = Vec::with_capacity(self.to.len() + 1);
        out.extend(batch);
        for &d in &self.to {
            out.push(if d == -1 { variable.next()? } else { d });
        }
        let count = |s: &[i64]| s.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
        (count(&out)? == count(shape)?).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ModelConfig {
        tritium_config::parse_config(text, std::path::Path::new("config.pbtxt")).expect("config")
    }

    #[test]
    fn inputs_reach_the_model_in_their_reshape_shape_after_the_batch_dimension() {
        let r = Reshapes::new(&config(
            r#"name: "m" max_batch_size: 4
               input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
                       { name: "S" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } },
                       { name: "V" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape: { shape: [ 3, -1, 1 ] } },
                       { name: "P" data_type: TYPE_FP32 dims: [ 3 ] } ]"#,
        ));
        let mut x = vec![3, 4];
        r.input("X", &mut x);
        assert_eq!(x, [3, 2, 2]);
        // Triton's idiom for a scalar per batch item: dims [1], reshape [].
        let mut s = vec![5, 1];
        r.input("S", &mut s);
        assert_eq!(s, [5]);
        // A variable dimension keeps its size at the reshape's -1.
        let mut v = vec![2, 7, 3];
        r.input("V", &mut v);
        assert_eq!(v, [2, 3, 7, 1]);
        let mut p = vec![2, 3];
        r.input("P", &mut p);
        assert_eq!(p, [2, 3]);
    }

    #[test]
    fn a_non_batching_model_reshapes_the_whole_shape() {
        let r = Reshapes::new(&config(
            r#"name: "m" max_batch_size: 0
               input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape: { shape: [ 6 ] } } ]
               output [ { name: "Y" data_type: TYPE_FP32 dims: [ 6 ] reshape: { shape: [ 3, 2 ] } } ]"#,
        ));
        let mut x = vec![2, 3];
        r.input("X", &mut x);
        assert_eq!(x, [6]);
        let mut y = vec![3, 2];
        r.output("Y", &mut y);
        assert_eq!(y, [6]);
    }

    #[test]
    fn outputs_go_to_the_client_in_their_dims_shape_unless_they_do_not_fit() {
        let r = Reshapes::new(&config(
            r#"name: "m" max_batch_size: 8
               output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
                        { name: "W" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ -1, 1 ] } } ]"#,
        ));
        let mut y = vec![3, 2, 2];
        r.output("Y", &mut y);
        assert_eq!(y, [3, 4]);
        let mut w = vec![2, 5, 1];
        r.output("W", &mut w);
        assert_eq!(w, [2, 5]);
        // Another rank, or another element count: left as the model made it.
        for mut odd in [vec![3, 4], vec![3, 2, 3], vec![]] {
            let before = odd.clone();
            r.output("Y", &mut odd);
            assert_eq!(odd, before);
        }
        let plain = Reshapes::new(&config(r#"name: "m" output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]"#));
        let mut y = vec![2, 2];
        plain.output("Y", &mut y);
        assert_eq!(y, [2, 2]);
    }
}

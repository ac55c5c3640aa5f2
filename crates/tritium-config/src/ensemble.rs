//! Triton's checks of an ensemble (`platform: "ensemble"`), with Triton's texts:
//!
//! - [`check_data_flow`]: the graph of ensemble tensors alone (core `model_config_utils.cc`,
//!   BuildEnsembleGraph and the data-flow part of ValidateEnsembleSchedulingConfig): each
//!   tensor written once, every ensemble input used, every ensemble output written (a cycle
//!   leaves its tensors unwritten), no tensor unused. Run by [`crate::normalize()`].
//! - [`check_steps`]: the ensemble against its step models' completed configs (core
//!   `ensemble_utils.cc`, ValidateEnsembleConfig): `max_batch_size`, every step input mapped
//!   once and to existing inputs and outputs, data types and shapes of connected tensors, and
//!   the decoupled rule (no step receives inputs that come from different decoupled steps). It
//!   says whether the ensemble is decoupled (any decoupled step makes it so).

use std::collections::HashMap;

use crate::proto::{model_config::SchedulingChoice, ModelConfig, ModelEnsembling};
use crate::ConfigError;

/// The platform name of an ensemble.
pub const ENSEMBLE_PLATFORM: &str = "ensemble";

/// Whether `config` is an ensemble's.
pub fn is_ensemble(config: &ModelConfig) -> bool {
    config.platform == ENSEMBLE_PLATFORM
}

/// Whether `config` sets `model_transaction_policy { decoupled: true }`: its responses are
/// streamed, any number per request.
pub fn is_decoupled(config: &ModelConfig) -> bool {
    config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled)
}

/// The ensemble scheduling of `config`, if it has one.
pub fn ensemble_scheduling(config: &ModelConfig) -> Option<&ModelEnsembling> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(e)) => Some(e),
        _ => None,
    }
}

/// A map's entries sorted by key, so that checks (and their errors) are deterministic.
fn sorted(map: &HashMap<String, String>) -> Vec<(&String, &String)> {
    let mut v: Vec<_> = map.iter().collect();
    v.sort();
    v
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(message)
}

#[derive(Default)]
struct FlowNode {
    written: bool,
    ready: bool,
    prev: Vec<usize>,
    next: Vec<usize>,
}

/// BuildEnsembleGraph and ValidateEnsembleSchedulingConfig's data-flow checks. Expects the
/// step-level checks (`model_name`, `input_map`, `output_map` present) to have passed.
pub(crate) fn check_data_flow(config: &ModelConfig, ensemble: &ModelEnsembling) -> Result<(), ConfigError> {
    let name = &config.name;
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut names: Vec<&str> = Vec::new();
    let mut nodes: Vec<FlowNode> = Vec::new();
    for (step_idx, step) in ensemble.step.iter().enumerate() {
        let mut written = Vec::new();
        for (_, tensor) in sorted(&step.output_map) {
            let i = match index.get(tensor.as_str()) {
                Some(&i) if nodes[i].written => {
                    return Err(invalid(format!(
                        "ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' \
                         step {step_idx}"
                    )));
                }
                Some(&i) => i,
                None => {
                    index.insert(tensor, nodes.len());
                    names.push(tensor);
                    nodes.push(FlowNode::default());
                    nodes.len() - 1
                }
            };
            nodes[i].written = true;
            written.push(i);
        }
        for (_, tensor) in sorted(&step.input_map) {
            let i = *index.entry(tensor).or_insert_with(|| {
                names.push(tensor);
                nodes.push(FlowNode::default());
                nodes.len() - 1
            });
            for &o in &written {
                nodes[o].prev.push(i);
                nodes[i].next.push(o);
            }
        }
    }
    let mut queue = std::collections::VecDeque::new();
    for input in &config.input {
        let Some(&i) = index.get(input.name.as_str()) else {
            return Err(invalid(format!("ensemble input '{}' for ensemble {name}' is not used", input.name)));
        };
        nodes[i].ready = true;
        queue.push_back(i);
    }
    while let Some(i) = queue.pop_front() {
        for n in nodes[i].next.clone() {
            if nodes[n].ready {
                continue;
            }
            if nodes[n].prev.iter().all(|&p| nodes[p].ready) {
                nodes[n].ready = true;
                queue.push_back(n);
            }
        }
    }
    let mut outputs = Vec::new();
    for output in &config.output {
        let Some(&i) = index.get(output.name.as_str()) else {
            return Err(invalid(format!("ensemble output '{}' for ensemble {name}' is not used", output.name)));
        };
        if !nodes[i].ready {
            let mut message = format!("output '{}' for ensemble '{name}' is not written", output.name);
            // Follow unwritten producers back to the source; a cycle is cut by `seen`.
            let mut last = i;
            let mut seen = std::collections::HashSet::new();
            let mut prev = Some(nodes[i].prev.clone());
            while let Some(candidates) = prev.take() {
                for p in candidates {
                    if !nodes[p].ready && seen.insert(p) {
                        last = p;
                        prev = Some(nodes[p].prev.clone());
                        break;
                    }
                }
            }
            if last != i {
                message += &format!(": at least one of its depending tensors, '{}', is not connected", names[last]);
            }
            return Err(invalid(message));
        }
        outputs.push(i);
    }
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| names[i]);
    for i in order {
        if outputs.contains(&i) {
            continue;
        }
        if !nodes[i].ready || nodes[i].next.is_empty() {
            return Err(invalid(format!("ensemble tensor '{}' is unused in ensemble '{name}'", names[i])));
        }
    }
    Ok(())
}

/// What a tensor of the ensemble is, as the model that produces or consumes it declares it.
#[derive(Clone)]
struct TensorNode {
    model: String,
    data_type: i32,
    dims: Vec<i64>,
    full_dims: Vec<i64>,
    decoupled: bool,
    label: usize,
    visited: bool,
    prev: Vec<usize>,
    next: Vec<usize>,
    /// The outputs of one step share a sibling, so that they get one decoupled label.
    sibling: Option<usize>,
}

impl TensorNode {
    fn new(model: &str, batching: bool, data_type: i32, dims: &[i64]) -> Self {
        let full_dims =
            if batching { std::iter::once(-1).chain(dims.iter().copied()).collect() } else { dims.to_vec() };
        Self {
            model: model.to_string(),
            data_type,
            dims: dims.to_vec(),
            full_dims,
            decoupled: false,
            label: 0,
            visited: false,
            prev: Vec::new(),
            next: Vec::new(),
            sibling: None,
        }
    }
}

fn dims_match(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y || x == -1 || y == -1)
}

fn dims_text(dims: &[i64]) -> String {
    format!("[{}]", dims.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
}

fn type_name(t: i32) -> &'static str {
    crate::proto::DataType::try_from(t).map_or("TYPE_INVALID", |t| t.as_str_name())
}

/// ValidateTensorConsistency.
fn consistent(lhs: &TensorNode, rhs: &TensorNode, prefix: &str) -> Result<(), ConfigError> {
    if lhs.data_type != rhs.data_type {
        return Err(invalid(format!(
            "{prefix}inconsistent data type: {} is inferred from model {} while {} is inferred from model {}",
            type_name(lhs.data_type),
            lhs.model,
            type_name(rhs.data_type),
            rhs.model
        )));
    }
    if !dims_match(&lhs.dims, &rhs.dims) && !dims_match(&lhs.full_dims, &rhs.full_dims) {
        return Err(invalid(format!(
            "{prefix}inconsistent shape: {} is inferred from model {} while {} is inferred from model {}",
            dims_text(&lhs.full_dims),
            lhs.model,
            dims_text(&rhs.full_dims),
            rhs.model
        )));
    }
    Ok(())
}

/// The tensors of an ensemble, by name, in one arena (the sink and siblings have no name).
#[derive(Default)]
struct Tensors {
    nodes: Vec<TensorNode>,
    by_name: HashMap<String, usize>,
}

impl Tensors {
    fn push(&mut self, node: TensorNode) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
}

/// ValidateEnsembleConfig: checks ensemble `config` against `steps`, the completed configs of
/// its step models in step order, and returns whether the ensemble is decoupled.
pub fn check_steps(config: &ModelConfig, steps: &[&ModelConfig]) -> Result<bool, ConfigError> {
    let Some(ensemble) = ensemble_scheduling(config) else { return Ok(false) };
    let name = &config.name;
    let batching = config.max_batch_size > 0;
    let mut t = Tensors::default();
    for input in &config.input {
        let dims = input.reshape.as_ref().map_or(&input.dims, |r| &r.shape);
        let i = t.push(TensorNode::new(name, batching, input.data_type, dims));
        t.by_name.entry(input.name.clone()).or_insert(i);
    }
    let sink = t.push(TensorNode::new(name, false, 0, &[]));
    for output in &config.output {
        let dims = output.reshape.as_ref().map_or(&output.dims, |r| &r.shape);
        let i = match t.by_name.get(&output.name) {
            Some(&i) => i,
            None => {
                let i = t.push(TensorNode::new(name, batching, output.data_type, dims));
                t.by_name.insert(output.name.clone(), i);
                i
            }
        };
        t.nodes[sink].prev.push(i);
        t.nodes[i].next.push(sink);
    }
    for (step, model) in ensemble.step.iter().zip(steps) {
        if model.max_batch_size != 0 && model.max_batch_size < config.max_batch_size {
            return Err(invalid(format!(
                "ensemble {name} allows maximum batch size {}, but it contains model {} which only allows maximum \
                 batch size to be {}",
                config.max_batch_size, step.model_name, model.max_batch_size
            )));
        }
        check_mapping(name, step, model, &mut t)?;
    }
    // Decoupled labels, in data-flow order from the ensemble's inputs.
    let mut label = 0;
    let mut queue = std::collections::VecDeque::new();
    for input in &config.input {
        if let Some(&i) = t.by_name.get(&input.name) {
            t.nodes[i].visited = true;
            queue.push_back(i);
        }
    }
    while let Some(current) = queue.pop_front() {
        for next in t.nodes[current].next.clone() {
            if t.nodes[next].visited || !t.nodes[next].prev.iter().all(|&p| t.nodes[p].visited) {
                continue;
            }
            let first = t.nodes[next].prev[0];
            let prev_label = t.nodes[first].label;
            if t.nodes[next].prev.iter().any(|&p| t.nodes[p].label != prev_label) {
                return Err(invalid(format!(
                    "in ensemble {name}, step of model '{}' receives inputs originated from different decoupled models",
                    t.nodes[next].model
                )));
            }
            let own = |label: &mut usize, decoupled: bool| {
                if decoupled {
                    *label += 1;
                    *label
                } else {
                    prev_label
                }
            };
            match t.nodes[next].sibling {
                Some(s) if t.nodes[s].visited => t.nodes[next].label = t.nodes[s].label,
                Some(s) => {
                    let l = own(&mut label, t.nodes[next].decoupled);
                    t.nodes[next].label = l;
                    t.nodes[s].label = l;
                    t.nodes[s].visited = true;
                }
                None => t.nodes[next].label = own(&mut label, t.nodes[next].decoupled),
            }
            t.nodes[next].visited = true;
            queue.push_back(next);
        }
    }
    Ok(label != 0)
}

/// ValidateTensorMapping: one step's maps against its model's inputs and outputs.
fn check_mapping(
    name: &str,
    step: &crate::proto::model_ensembling::Step,
    model: &ModelConfig,
    t: &mut Tensors,
) -> Result<(), ConfigError> {
    let step_id = &step.model_name;
    let batching = model.max_batch_size > 0;
    for (model_input, tensor) in sorted(&step.input_map) {
        if !model.input.iter().any(|i| &i.name == model_input) {
            return Err(invalid(format!(
                "in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {model_input} in model \
                 {step_id}"
            )));
        }
    }
    for input in &model.input {
        let Some(tensor) = step.input_map.get(&input.name) else {
            if input.optional {
                continue;
            }
            return Err(invalid(format!(
                "in ensemble {name}, input {} in model {step_id} is not mapped to any ensemble tensors",
                input.name
            )));
        };
        let node = TensorNode::new(step_id, batching, input.data_type, &input.dims);
        match t.by_name.get(tensor) {
            Some(&i) => consistent(&t.nodes[i], &node, &format!("in ensemble {name}, ensemble tensor {tensor}: "))?,
            None => {
                let i = t.push(node);
                t.by_name.insert(tensor.clone(), i);
            }
        }
    }
    for (model_output, tensor) in sorted(&step.output_map) {
        if !model.output.iter().any(|o| &o.name == model_output) {
            return Err(invalid(format!(
                "in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output {model_output} in \
                 model {step_id}"
            )));
        }
    }
    let sibling = t.push(TensorNode::new(step_id, false, 0, &[]));
    let decoupled = is_decoupled(model);
    for (model_output, tensor) in sorted(&step.output_map) {
        let Some(output) = model.output.iter().find(|o| &o.name == model_output) else { continue };
        let node = TensorNode::new(step_id, batching, output.data_type, &output.dims);
        let i = match t.by_name.get(tensor) {
            Some(&i) => {
                consistent(&t.nodes[i], &node, &format!("in ensemble {name}, ensemble tensor {tensor}: "))?;
                i
            }
            None => {
                let i = t.push(node);
                t.by_name.insert(tensor.clone(), i);
                i
            }
        };
        t.nodes[i].sibling = Some(sibling);
        t.nodes[i].decoupled = decoupled;
        for (_, input) in sorted(&step.input_map) {
            if let Some(&p) = t.by_name.get(input) {
                t.nodes[i].prev.push(p);
                t.nodes[p].next.push(i);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_config;

    fn config(text: &str) -> ModelConfig {
        parse_config(text, std::path::Path::new("config.pbtxt")).expect("parses")
    }

    const STEP: &str = r#"
        name: "step" backend: "python" max_batch_size: 4
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
    "#;

    fn ensemble(steps: &str, extra: &str) -> ModelConfig {
        let mut c = config(&format!(
            r#"name: "ens" platform: "ensemble" max_batch_size: 4
            input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }} ]
            output [ {{ name: "Z" data_type: TYPE_FP32 dims: [ 4 ] }} ]
            ensemble_scheduling {{ {steps} }}
            {extra}"#
        ));
        c.name = "ens".into();
        c
    }

    fn step(input: &str, output: &str) -> String {
        format!(
            r#"step [ {{ model_name: "step" model_version: -1 input_map {{ key: "IN" value: "{input}" }}
               output_map {{ key: "OUT" value: "{output}" }} }} ]"#
        )
    }

    fn flow(c: &ModelConfig) -> Result<(), String> {
        check_data_flow(c, ensemble_scheduling(c).expect("ensemble")).map_err(|e| e.to_string())
    }

    #[test]
    fn data_flow_errors_have_tritons_texts() {
        assert_eq!(flow(&ensemble(&step("A", "Z"), "")), Ok(()));
        assert_eq!(flow(&ensemble(&format!("{}\n{}", step("A", "M"), step("M", "Z")), "")), Ok(()));
        assert_eq!(
            flow(&ensemble(&format!("{}\n{}", step("A", "Z"), step("A", "Z")), "")),
            Err("ensemble tensor 'Z' can appear in an output map only once for ensemble 'ens' step 1".into())
        );
        assert_eq!(
            flow(&ensemble(&step("B", "Z"), "")),
            Err("ensemble input 'A' for ensemble ens' is not used".into())
        );
        assert_eq!(
            flow(&ensemble(&step("A", "Y"), "")),
            Err("ensemble output 'Z' for ensemble ens' is not used".into())
        );
        // Z needs M, which needs the unwritten X: "not connected".
        assert_eq!(
            flow(&ensemble(&format!("{}\n{}\n{}", step("A", "Y"), step("X", "M"), step("M", "Z")), "")),
            Err("output 'Z' for ensemble 'ens' is not written: at least one of its depending tensors, 'X', is not \
                 connected"
                .into())
        );
        // A cycle: M and N feed each other, so Z is never written.
        let join = r#"step [ { model_name: "step" input_map { key: "IN" value: "A" } input_map { key: "IN2" value: "N" }
            output_map { key: "OUT" value: "M" } } ]"#;
        let cycle = format!("{join}\n{}\n{}", step("M", "N"), step("M", "Z"));
        let e = flow(&ensemble(&cycle, "")).expect_err("a cycle");
        assert!(e.starts_with("output 'Z' for ensemble 'ens' is not written"), "{e}");
        // A tensor written and read by nobody.
        assert_eq!(
            flow(&ensemble(&format!("{}\n{}", step("A", "Z"), step("A", "Q")), "")),
            Err("ensemble tensor 'Q' is unused in ensemble 'ens'".into())
        );
    }

    fn steps_check(c: &ModelConfig, models: &[&ModelConfig]) -> Result<bool, String> {
        check_steps(c, models).map_err(|e| e.to_string())
    }

    #[test]
    fn step_checks_have_tritons_texts() {
        let s = config(STEP);
        let chain = ensemble(&format!("{}\n{}", step("A", "M"), step("M", "Z")), "");
        assert_eq!(steps_check(&chain, &[&s, &s]), Ok(false));
        let small = config(&STEP.replace("max_batch_size: 4", "max_batch_size: 2"));
        assert_eq!(
            steps_check(&chain, &[&small, &s]),
            Err("ensemble ens allows maximum batch size 4, but it contains model step which only allows maximum \
                 batch size to be 2"
                .into())
        );
        let int = config(
            &STEP.replace("TYPE_FP32 dims: [ 4 ] } ]\n        output", "TYPE_INT32 dims: [ 4 ] } ]\n        output"),
        );
        assert_eq!(
            steps_check(&chain, &[&int, &s]),
            Err("in ensemble ens, ensemble tensor A: inconsistent data type: TYPE_FP32 is inferred from model ens \
                 while TYPE_INT32 is inferred from model step"
                .into())
        );
        let wide = config(&STEP.replace("dims: [ 4 ] } ]\n        output", "dims: [ 5 ] } ]\n        output"));
        assert_eq!(
            steps_check(&chain, &[&wide, &s]),
            Err("in ensemble ens, ensemble tensor A: inconsistent shape: [-1,4] is inferred from model ens while \
                 [-1,5] is inferred from model step"
                .into())
        );
        let two_inputs = config(&STEP.replace(
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 4 ] } ]",
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 4 ] }, { name: \"IN2\" data_type: TYPE_FP32 dims: \
             [ 4 ] } ]",
        ));
        assert_eq!(
            steps_check(&chain, &[&two_inputs, &s]),
            Err("in ensemble ens, input IN2 in model step is not mapped to any ensemble tensors".into())
        );
        let renamed = config(&STEP.replace("name: \"IN\"", "name: \"X\""));
        assert_eq!(
            steps_check(&chain, &[&renamed, &s]),
            Err("in ensemble ens, ensemble tensor A is mapping to non-existing input IN in model step".into())
        );
        let renamed = config(&STEP.replace("name: \"OUT\"", "name: \"Y\""));
        assert_eq!(
            steps_check(&chain, &[&renamed, &s]),
            Err("in ensemble ens, ensemble tensor M is mapped from non-existing output OUT in model step".into())
        );
        // A non-batching step in a batching ensemble is fine when the full shapes agree.
        let full =
            config(&STEP.replace("max_batch_size: 4", "max_batch_size: 0").replace("dims: [ 4 ]", "dims: [ -1, 4 ]"));
        assert_eq!(steps_check(&chain, &[&full, &s]), Ok(false));
    }

    #[test]
    fn a_decoupled_step_makes_the_ensemble_decoupled_and_labels_may_not_mix() {
        let s = config(STEP);
        let d = config(&format!("{STEP}\nmodel_transaction_policy {{ decoupled: true }}"));
        let chain = ensemble(&format!("{}\n{}", step("A", "M"), step("M", "Z")), "");
        assert_eq!(steps_check(&chain, &[&d, &s]), Ok(true));
        // Z's step reads M (from the decoupled step) and A (from the request): mixed origins.
        let two = r#"
            name: "two" backend: "python" max_batch_size: 4
            input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "IN2" data_type: TYPE_FP32 dims: [ 4 ] } ]
            output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        "#;
        let two = config(two);
        let mixed = ensemble(
            &format!(
                r#"{}
                step [ {{ model_name: "two" input_map {{ key: "IN" value: "M" }} input_map {{ key: "IN2" value: "A" }}
                   output_map {{ key: "OUT" value: "Z" }} }} ]"#,
                step("A", "M")
            ),
            "",
        );
        assert_eq!(
            steps_check(&mixed, &[&d, &two]),
            Err("in ensemble ens, step of model 'ens' receives inputs originated from different decoupled models"
                .into())
        );
        assert_eq!(steps_check(&mixed, &[&s, &two]), Ok(false));
    }
}

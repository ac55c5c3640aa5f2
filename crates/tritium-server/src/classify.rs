//! Triton's classification extension (`src/classification.cc` in `triton-inference-server/server`):
//! an output requested with `classification: k` is answered as the top `k` elements of each batch
//! entry, as `BYTES` strings `"value:index[:label]"`, computed once here for every frontend.
//!
//! Choices where Triton's behaviour is unspecified or platform-dependent: values print as C++'s
//! `std::to_string` does (`%f` for floats), except that every NaN prints `nan` (glibc prints
//! `-nan` for a NaN with the sign bit set); NaN ranks below every number; equal values keep their
//! index order.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::path::Path;

use tritium_config::ModelConfig;

use crate::confine::PathPolicy;
use crate::types::{DataType, ErrorKind, InferError, OutputTensor, MAX_CLASSIFICATION_ELEMENTS};

/// Why an output cannot be answered as classes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClassifyError {
    /// Triton ranks integers, FP32 and FP64 only.
    #[error("class result not available for output due to unsupported type '{0}'")]
    UnsupportedType(&'static str),
    /// More elements than Triton ranks in one batch entry.
    #[error("classification output tensor too large")]
    TooLarge,
    /// The model returned a shape with a negative or overflowing dimension.
    #[error("output '{name}' has an invalid shape {shape:?}")]
    BadShape {
        /// The output.
        name: String,
        /// Its shape.
        shape: Vec<i64>,
    },
}

impl From<ClassifyError> for InferError {
    fn from(e: ClassifyError) -> Self {
        let kind = match e {
            ClassifyError::BadShape { .. } => ErrorKind::Internal,
            ClassifyError::UnsupportedType(_) | ClassifyError::TooLarge => ErrorKind::InvalidArg,
        };
        InferError::new(kind, e.to_string())
    }
}

/// Why a model's label files cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the label file {path} of output '{output}': {reason}")]
pub(crate) struct LabelError {
    output: String,
    path: String,
    reason: String,
}

/// The largest label file read: labels are a line per class, and a config (perhaps a client's
/// load override) must not make the server read an endless file into memory.
const MAX_LABEL_FILE_BYTES: u64 = 64 << 20;

/// What a version needs to answer classifications: whether its first dimension is the batch,
/// and each output's labels (from its `label_filename`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Classes {
    /// `max_batch_size > 0`.
    pub batching: bool,
    /// Labels by output name, one per line of the output's label file.
    pub labels: HashMap<String, Vec<String>>,
}

impl Classes {
    /// Reads the label files `config` names, relative to the model directory, as Triton's
    /// `LabelProvider` does (one label per line; a missing file fails the load).
    pub(crate) fn load(model_dir: &Path, config: &ModelConfig, paths: &PathPolicy) -> Result<Self, LabelError> {
        let mut labels = HashMap::new();
        for o in config.output.iter().filter(|o| !o.label_filename.is_empty()) {
            let failed = |reason: String| LabelError {
                output: o.name.clone(),
                path: model_dir.join(&o.label_filename).display().to_string(),
                reason,
            };
            let what = format!("label_filename of output '{}'", o.name);
            let limit = "the label file limit";
            let text = paths
                .read_bounded(&what, &o.label_filename, model_dir, model_dir, MAX_LABEL_FILE_BYTES, limit)
                .map_err(failed)?;
            labels.insert(o.name.clone(), parse_labels(&String::from_utf8_lossy(&text)));
        }
        Ok(Self { batching: config.max_batch_size > 0, labels })
    }

    /// `output` answered as its top `k` classes.
    pub(crate) fn classify(&self, output: &OutputTensor, k: u32) -> Result<OutputTensor, ClassifyError> {
        classify(output, k, self.batching, self.labels.get(&output.name).map(Vec::as_slice))
    }
}

/// A label file's lines, as `std::getline` splits them.
fn parse_labels(text: &str) -> Vec<String> {
    text.split_terminator('\n').map(str::to_string).collect()
}

/// Triton's `TopkClassifications` over each batch entry of `output` (the first dimension is the
/// batch when `batching`): a `BYTES` tensor of shape `[batch, min(k, n)]` (`[min(k, n)]` without
/// a batch dimension). A batch entry past the end of the data ranks nothing, as in Triton.
pub(crate) fn classify(
    output: &OutputTensor,
    k: u32,
    batching: bool,
    labels: Option<&[String]>,
) -> Result<OutputTensor, ClassifyError> {
    let size = match output.datatype {
        DataType::Bool | DataType::Fp16 | DataType::Bf16 | DataType::Bytes => None,
        d => d.element_size(),
    }
    .ok_or(ClassifyError::UnsupportedType(output.datatype.wire_name()))?;
    let bad_shape = || ClassifyError::BadShape { name: output.name.clone(), shape: output.shape.clone() };
    let shape = &output.shape;
    let batch_size = match shape.first() {
        Some(&b) if batching => usize::try_from(b).map_err(|_| bad_shape())?,
        _ => 0,
    };
    let inner = if batch_size == 0 { &shape[..] } else { &shape[1..] };
    let batch1_count =
        inner.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?)).ok_or_else(bad_shape)?;
    let batch1_bytes = batch1_count.checked_mul(size).ok_or_else(bad_shape)?;
    let k = usize::try_from(k).unwrap_or(usize::MAX);
    let mut data = Vec::new();
    let mut offset = 0usize;
    // The shape comes from model code: the batch dimension bounds nothing by itself, so the
    // loop ends with the data (an entry past its end, or of no bytes, ranks nothing anyway).
    for _ in 0..batch_size.max(1) {
        if batch1_bytes == 0 || offset >= output.data.len() {
            break;
        }
        let chunk = offset.checked_add(batch1_bytes).and_then(|end| output.data.get(offset..end)).unwrap_or(&[]);
        if chunk.len() / size > MAX_CLASSIFICATION_ELEMENTS {
            return Err(ClassifyError::TooLarge);
        }
        top_k(output.datatype, chunk, k, labels, &mut data);
        offset = offset.saturating_add(batch1_bytes);
    }
    let mut new_shape = Vec::with_capacity(2);
    if batch_size > 0 {
        new_shape.push(i64::try_from(batch_size).unwrap_or(i64::MAX));
    }
    new_shape.push(i64::try_from(batch1_count.min(k)).unwrap_or(i64::MAX));
    Ok(OutputTensor { name: output.name.clone(), datatype: DataType::Bytes, shape: new_shape, data })
}

/// Appends the top `k` classes of one batch entry to `out`, serialized as `BYTES`.
fn top_k(dtype: DataType, chunk: &[u8], k: usize, labels: Option<&[String]>, out: &mut Vec<u8>) {
    let int = |v: i128| v.to_string();
    match dtype {
        DataType::Uint8 => rank::<u8, 1>(chunk, k, labels, u8::from_le_bytes, |v| int(v.into()), out),
        DataType::Int8 => rank::<i8, 1>(chunk, k, labels, i8::from_le_bytes, |v| int(v.into()), out),
        DataType::Uint16 => rank::<u16, 2>(chunk, k, labels, u16::from_le_bytes, |v| int(v.into()), out),
        DataType::Int16 => rank::<i16, 2>(chunk, k, labels, i16::from_le_bytes, |v| int(v.into()), out),
        DataType::Uint32 => rank::<u32, 4>(chunk, k, labels, u32::from_le_bytes, |v| int(v.into()), out),
        DataType::Int32 => rank::<i32, 4>(chunk, k, labels, i32::from_le_bytes, |v| int(v.into()), out),
        DataType::Uint64 => rank::<u64, 8>(chunk, k, labels, u64::from_le_bytes, |v| int(v.into()), out),
        DataType::Int64 => rank::<i64, 8>(chunk, k, labels, i64::from_le_bytes, |v| int(v.into()), out),
        DataType::Fp32 => rank::<f32, 4>(chunk, k, labels, f32::from_le_bytes, |v| float_text(v.into()), out),
        DataType::Fp64 => rank::<f64, 8>(chunk, k, labels, f64::from_le_bytes, float_text, out),
        DataType::Bool | DataType::Fp16 | DataType::Bf16 | DataType::Bytes => {}
    }
}

fn rank<T: Copy + PartialOrd, const N: usize>(
    chunk: &[u8],
    k: usize,
    labels: Option<&[String]>,
    from_le: fn([u8; N]) -> T,
    text: impl Fn(T) -> String,
    out: &mut Vec<u8>,
) {
    let values: Vec<T> = chunk
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            from_le(a)
        })
        .collect();
    for i in ranked(&values).into_iter().take(k) {
        let mut s = format!("{}:{i}", text(values[i]));
        if let Some(label) = labels.and_then(|l| l.get(i)).filter(|l| !l.is_empty()) {
            s.push(':');
            s.push_str(label);
        }
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
}

/// Indices of `values` from the largest value down. The order is total: NaN (the one value not
/// equal to itself) ranks below every number, and equal values keep their index order.
fn ranked<T: PartialOrd>(values: &[T]) -> Vec<usize> {
    let number = |i: usize| values[i].partial_cmp(&values[i]).is_some();
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| match (number(a), number(b)) {
        (true, true) => values[b].partial_cmp(&values[a]).unwrap_or(Ordering::Equal),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => Ordering::Equal,
    });
    idx
}

/// C++'s `std::to_string` of a floating-point value (`%f`), with `nan` for every NaN.
fn float_text(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v < 0.0 { "-inf" } else { "inf" }.into()
    } else {
        format!("{v:.6}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(datatype: DataType, shape: &[i64], data: Vec<u8>) -> OutputTensor {
        OutputTensor { name: "P".into(), datatype, shape: shape.to_vec(), data }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// The strings of a serialized `BYTES` tensor.
    fn strings(data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = data;
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = u32::from_le_bytes(*len) as usize;
            out.push(String::from_utf8(tail[..len].to_vec()).expect("utf-8"));
            rest = &tail[len..];
        }
        out
    }

    fn check(t: &OutputTensor, k: u32, batching: bool, labels: Option<&[String]>) -> (Vec<i64>, Vec<String>) {
        let c = classify(t, k, batching, labels).expect("classify");
        assert_eq!((c.name.as_str(), c.datatype), ("P", DataType::Bytes));
        (c.shape, strings(&c.data))
    }

    #[test]
    fn fp32_top_k_with_cpp_formatting() {
        let t = tensor(DataType::Fp32, &[4], f32s(&[0.1, 0.7, -2.5, 0.2]));
        assert_eq!(check(&t, 2, false, None), (vec![2], vec!["0.700000:1".into(), "0.200000:3".into()]));
    }

    #[test]
    fn integers_rank_exactly() {
        let i32s: Vec<u8> = [5i32, -7, 9, 5].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = tensor(DataType::Int32, &[4], i32s);
        assert_eq!(check(&t, 3, false, None).1, ["9:2", "5:0", "5:3"]);
        // Values past f64's precision still rank by their exact value.
        let big: Vec<u8> = [u64::MAX - 1, u64::MAX].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = tensor(DataType::Uint64, &[2], big);
        assert_eq!(check(&t, 1, false, None).1, [format!("{}:1", u64::MAX)]);
        let t = tensor(DataType::Int8, &[2], vec![0xff, 3]);
        assert_eq!(check(&t, 2, false, None).1, ["3:1", "-1:0"]);
    }

    #[test]
    fn every_numeric_type_ranks_and_prints_as_cpp() {
        fn le<T: Copy, const N: usize>(v: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
            v.iter().flat_map(|x| f(*x)).collect()
        }
        for (dtype, data, want) in [
            (DataType::Uint8, vec![1u8, 200], "200:1"),
            (DataType::Int8, vec![0xff, 3], "3:1"),
            (DataType::Uint16, le(&[1u16, 9], u16::to_le_bytes), "9:1"),
            (DataType::Int16, le(&[-1i16, -9], i16::to_le_bytes), "-1:0"),
            (DataType::Uint32, le(&[7u32, 9], u32::to_le_bytes), "9:1"),
            (DataType::Uint64, le(&[u64::MAX, 9], u64::to_le_bytes), "18446744073709551615:0"),
            (DataType::Int64, le(&[-4i64, -9], i64::to_le_bytes), "-4:0"),
            (DataType::Fp64, le(&[0.25f64, -1.0], f64::to_le_bytes), "0.250000:0"),
        ] {
            assert_eq!(check(&tensor(dtype, &[2], data), 1, false, None).1, [want], "{dtype:?}");
        }
    }

    #[test]
    fn nan_prints_nan_whatever_its_sign_and_ranks_last() {
        let neg_nan = f32::from_bits(f32::NAN.to_bits() | 0x8000_0000);
        let t = tensor(DataType::Fp32, &[4], f32s(&[neg_nan, 1.0, f32::NAN, f32::NEG_INFINITY]));
        assert_eq!(check(&t, 4, false, None).1, ["1.000000:1", "-inf:3", "nan:0", "nan:2"]);
        let t = tensor(DataType::Fp64, &[2], [f64::INFINITY, -0.0].iter().flat_map(|x| x.to_le_bytes()).collect());
        assert_eq!(check(&t, 2, false, None).1, ["inf:0", "-0.000000:1"]);
    }

    #[test]
    fn k_larger_than_the_tensor_returns_every_class() {
        let t = tensor(DataType::Fp32, &[2], f32s(&[1.0, 2.0]));
        assert_eq!(check(&t, 10, false, None), (vec![2], vec!["2.000000:1".into(), "1.000000:0".into()]));
    }

    #[test]
    fn labels_are_appended_where_present() {
        let labels: Vec<String> = ["cat", "", "dog"].map(String::from).to_vec();
        let t = tensor(DataType::Fp32, &[4], f32s(&[0.1, 0.2, 0.3, 0.4]));
        assert_eq!(
            check(&t, 4, false, Some(&labels)).1,
            // Index 3 has no line in the file and index 1 an empty one: no label, as in Triton.
            ["0.400000:3", "0.300000:2:dog", "0.200000:1", "0.100000:0:cat"]
        );
        assert_eq!(check(&t, 1, false, None).1, ["0.400000:3"]);
    }

    #[test]
    fn batched_outputs_rank_each_entry() {
        let t = tensor(DataType::Fp32, &[2, 3], f32s(&[1.0, 3.0, 2.0, 6.0, 5.0, 4.0]));
        assert_eq!(
            check(&t, 2, true, None),
            (vec![2, 2], ["3.000000:1", "2.000000:2", "6.000000:0", "5.000000:1"].map(String::from).to_vec())
        );
        // Without batching the first dimension is part of the classes.
        assert_eq!(check(&t, 1, false, None), (vec![1], vec!["6.000000:3".into()]));
        // A batch entry past the end of the data ranks nothing.
        let short = tensor(DataType::Fp32, &[2, 3], f32s(&[1.0, 3.0, 2.0]));
        assert_eq!(check(&short, 1, true, None), (vec![2, 1], vec!["3.000000:1".into()]));
    }

    #[test]
    fn a_made_up_batch_dimension_does_not_drive_the_loop() {
        // Shapes claiming 2^62 entries over a few bytes finish at once.
        let t = tensor(DataType::Fp32, &[1 << 62, 2], f32s(&[1.0, 2.0]));
        assert_eq!(check(&t, 1, true, None), (vec![1 << 62, 1], vec!["2.000000:1".into()]));
        let t = tensor(DataType::Fp32, &[1 << 62, 0], f32s(&[1.0]));
        assert_eq!(check(&t, 1, true, None).1, Vec::<String>::new());
    }

    #[test]
    fn unsupported_types_and_bad_shapes_are_errors() {
        for dtype in [DataType::Bytes, DataType::Fp16, DataType::Bf16, DataType::Bool] {
            let e = classify(&tensor(dtype, &[2], vec![0; 4]), 1, false, None).expect_err("unsupported");
            let e = InferError::from(e);
            assert_eq!(e.kind, ErrorKind::InvalidArg);
            assert_eq!(
                e.message,
                format!("class result not available for output due to unsupported type '{}'", dtype.wire_name())
            );
        }
        let e = classify(&tensor(DataType::Fp32, &[-1], vec![]), 1, false, None).expect_err("bad shape");
        assert_eq!(InferError::from(e).kind, ErrorKind::Internal);
        let big = tensor(
            DataType::Uint8,
            &[MAX_CLASSIFICATION_ELEMENTS as i64 + 1],
            vec![0; MAX_CLASSIFICATION_ELEMENTS + 1],
        );
        assert_eq!(classify(&big, 1, false, None), Err(ClassifyError::TooLarge));
    }

    #[test]
    fn label_files_split_as_getline_does() {
        assert_eq!(parse_labels("a\nb\n"), ["a", "b"]);
        assert_eq!(parse_labels("a\n\nb"), ["a", "", "b"]);
        assert!(parse_labels("").is_empty());
    }

    #[test]
    fn label_files_load_relative_to_the_model_directory() {
        let dir = std::env::temp_dir().join(format!("tritium-labels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("labels.txt"), "zero\none\n").expect("write");
        let mut config = ModelConfig { max_batch_size: 4, ..Default::default() };
        config.output.push(tritium_config::proto::ModelOutput {
            name: "P".into(),
            label_filename: "labels.txt".into(),
            ..Default::default()
        });
        let classes = Classes::load(&dir, &config, &PathPolicy::default()).expect("load");
        assert!(classes.batching);
        assert_eq!(classes.labels["P"], ["zero", "one"]);
        config.output[0].label_filename = "missing.txt".into();
        let e = Classes::load(&dir, &config, &PathPolicy::default()).expect_err("missing file");
        assert!(e.to_string().starts_with("cannot read the label file"), "{e}");
        for outside in ["/etc/passwd", "../labels.txt", "/proc/self/environ"] {
            config.output[0].label_filename = outside.into();
            let e = Classes::load(&dir, &config, &PathPolicy::default()).expect_err(outside).to_string();
            assert!(e.contains("is outside the model's directory") && !e.contains("root:"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The JSON `data` of an input: a nested array walked once, without building a value tree,
//! each leaf written in the input's wire form.

use super::*;

/// Why reading a JSON `data` array stopped.
enum DataError {
    TooDeep,
    TooMany,
    Bad { index: u64, message: String },
}

/// The JSON text of an input's `data`, walked once, in order: each leaf (an element, at any
/// depth of nesting) is read as a scalar and handed to the type's writer, so memory stays about
/// the tensor's size, whatever the length of the array.
struct Walk<'a> {
    count: u64,
    expected: u64,
    out: &'a mut Vec<u8>,
    write: LeafWriter,
    /// Why the walk stopped, when it did.
    stop: Option<DataError>,
}

impl Walk<'_> {
    fn leaf<E: serde::de::Error>(&mut self, v: Value) -> Result<(), E> {
        if self.count >= self.expected {
            return self.fail(DataError::TooMany);
        }
        if let Err(message) = (self.write)(&v, self.out) {
            return self.fail(DataError::Bad { index: self.count, message });
        }
        self.count += 1;
        Ok(())
    }

    fn fail<E: serde::de::Error>(&mut self, e: DataError) -> Result<(), E> {
        self.stop = Some(e);
        Err(E::custom("stopped"))
    }
}

/// One value of the walk at `depth` (the `data` array itself is at depth 0).
struct WalkAt<'w, 'a> {
    walk: &'w mut Walk<'a>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for WalkAt<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.depth >= MAX_JSON_DEPTH {
            return self.walk.fail(DataError::TooDeep);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WalkAt<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor data")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.depth + 1;
        while seq.next_element_seed(WalkAt { walk: &mut *self.walk, depth })?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        // No type takes an object: the writer says so, naming the element.
        self.walk.leaf(Value::Object(serde_json::Map::new()))
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.walk.leaf(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.walk.leaf(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.walk.leaf(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.walk.leaf(Value::from(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.walk.leaf(Value::String(v.to_owned()))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.walk.leaf(Value::Null)
    }
}

/// Walks the JSON text `data`, writing up to `expected` leaves into `out`; returns the leaves
/// written and why the walk stopped early, if it did.
fn walk(data: &str, expected: u64, out: &mut Vec<u8>, write: LeafWriter) -> (u64, Option<DataError>) {
    let mut walk = Walk { count: 0, expected, out, write, stop: None };
    let mut de = serde_json::Deserializer::from_str(data);
    let res = WalkAt { walk: &mut walk, depth: 0 }.deserialize(&mut de);
    match (res, walk.stop) {
        (_, Some(stop)) => (walk.count, Some(stop)),
        (Ok(()), None) => (walk.count, None),
        // The text was checked as JSON already; anything else is reported at the element.
        (Err(e), None) => (walk.count, Some(DataError::Bad { index: walk.count, message: e.to_string() })),
    }
}

/// Counts the leaves of a nested array (for error messages), without converting them.
fn count_leaves(data: &str) -> u64 {
    let mut scratch = Vec::new();
    walk(data, u64::MAX, &mut scratch, |_, _| Ok(())).0
}

/// The JSON text as a value, for describing what it is in an error.
fn text_value(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or(Value::Null)
}

fn int_in<T: TryFrom<i64>>(v: &Value, what: &str) -> Result<T, String> {
    let i = v.as_i64().ok_or_else(|| format!("expected a signed integer for {what}, got {}", describe(v)))?;
    T::try_from(i).map_err(|_| format!("{i} is out of range for {what}"))
}

fn uint_in<T: TryFrom<u64>>(v: &Value, what: &str) -> Result<T, String> {
    let u = v.as_u64().ok_or_else(|| format!("expected an unsigned integer for {what}, got {}", describe(v)))?;
    T::try_from(u).map_err(|_| format!("{u} is out of range for {what}"))
}

fn float_of(v: &Value, what: &str) -> Result<f64, String> {
    v.as_f64().or_else(|| non_finite(v)).ok_or_else(|| format!("expected a number for {what}, got {}", describe(v)))
}

/// Why an input's JSON `data` cannot become tensor bytes (every one is `INVALID_ARGUMENT`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JsonDataError {
    /// The shape's element count overflows.
    #[error(
        "invalid shape for input '{name}': shape {shape} causes total element count to exceed maximum size of {}",
        i64::MAX
    )]
    ShapeTooLarge { name: String, shape: String },
    /// `data` is not an array.
    #[error("Unable to parse 'data' of input '{name}': expected an array, got {got}")]
    NotAnArray { name: String, got: String },
    /// FP16 and BF16 have no JSON form in Triton.
    #[error("receiving {dtype} data via JSON is not supported. Please use the binary data format for input {name}")]
    NoJsonForm { name: String, dtype: &'static str },
    /// The shape and the number of elements disagree.
    #[error(
        "Unable to parse 'data' of input '{name}': shape does not match true shape of 'data' field: shape {shape} has {expected} elements, but 'data' has {got}; make 'shape' and 'data' agree"
    )]
    CountMismatch { name: String, shape: String, expected: u64, got: u64 },
    /// Arrays nest deeper than Triton's limit.
    #[error(
        "Unable to parse 'data' of input '{name}': JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"
    )]
    TooDeep { name: String },
    /// An element is not of the input's type or out of its range.
    #[error("Unable to parse 'data' of input '{name}': element {index}: {message}")]
    BadElement { name: String, index: u64, message: String },
}

impl From<JsonDataError> for InferError {
    fn from(e: JsonDataError) -> Self {
        InferError::invalid(e.to_string())
    }
}

/// Converts an input's JSON `data` to its raw bytes (Triton's serialized form for `BYTES`), in
/// three steps: the element count from the shape, the checks on `data` as a whole, and the
/// conversion of each element.
pub(super) fn json_input_data(
    name: &str,
    dtype: DataType,
    shape: &[i64],
    data: Option<&RawValue>,
) -> Result<Vec<u8>, JsonDataError> {
    let expected = expected_elements(name, shape)?;
    if expected == 0 {
        // As Triton: a tensor with no elements has no data, whatever 'data' holds.
        return Ok(Vec::new());
    }
    let data = data.map_or("null", RawValue::get);
    let write = leaf_writer(name, dtype, data)?;
    convert_leaves(name, shape, dtype, data, expected, write)
}

/// Step 1: the number of elements `shape` holds.
pub(super) fn expected_elements(name: &str, shape: &[i64]) -> Result<u64, JsonDataError> {
    element_count(shape)
        .ok_or_else(|| JsonDataError::ShapeTooLarge { name: name.to_string(), shape: shape_string(shape) })
}

/// Writes one JSON element as tensor bytes, or says why it cannot.
pub(crate) type LeafWriter = fn(&Value, &mut Vec<u8>) -> Result<(), String>;

/// Step 2: checks `data` as a whole, and picks the writer of the type's elements.
pub(crate) fn leaf_writer(name: &str, dtype: DataType, data: &str) -> Result<LeafWriter, JsonDataError> {
    if !data.trim_start().starts_with('[') {
        return Err(JsonDataError::NotAnArray { name: name.to_string(), got: describe(&text_value(data)) });
    }
    Ok(match dtype {
        DataType::Fp16 | DataType::Bf16 => {
            return Err(JsonDataError::NoJsonForm { name: name.to_string(), dtype: dtype.wire_name() })
        }
        DataType::Bool => |v, o| {
            let b = v.as_bool().ok_or_else(|| format!("expected a boolean for BOOL, got {}", describe(v)))?;
            o.push(u8::from(b));
            Ok(())
        },
        DataType::Uint8 => |v, o| {
            o.push(uint_in::<u8>(v, "UINT8")?);
            Ok(())
        },
        DataType::Uint16 => |v, o| {
            o.extend_from_slice(&uint_in::<u16>(v, "UINT16")?.to_le_bytes());
            Ok(())
        },
        DataType::Uint32 => |v, o| {
            o.extend_from_slice(&uint_in::<u32>(v, "UINT32")?.to_le_bytes());
            Ok(())
        },
        DataType::Uint64 => |v, o| {
            o.extend_from_slice(&uint_in::<u64>(v, "UINT64")?.to_le_bytes());
            Ok(())
        },
        DataType::Int8 => |v, o| {
            o.extend_from_slice(&int_in::<i8>(v, "INT8")?.to_le_bytes());
            Ok(())
        },
        DataType::Int16 => |v, o| {
            o.extend_from_slice(&int_in::<i16>(v, "INT16")?.to_le_bytes());
            Ok(())
        },
        DataType::Int32 => |v, o| {
            o.extend_from_slice(&int_in::<i32>(v, "INT32")?.to_le_bytes());
            Ok(())
        },
        DataType::Int64 => |v, o| {
            o.extend_from_slice(&int_in::<i64>(v, "INT64")?.to_le_bytes());
            Ok(())
        },
        DataType::Fp32 => |v, o| {
            // As Triton: the double is narrowed to float (out-of-range values become infinite).
            o.extend_from_slice(&(float_of(v, "FP32")? as f32).to_le_bytes());
            Ok(())
        },
        DataType::Fp64 => |v, o| {
            o.extend_from_slice(&float_of(v, "FP64")?.to_le_bytes());
            Ok(())
        },
        DataType::Bytes => |v, o| {
            let s = match v {
                Value::String(s) if non_finite(v).is_none() => s,
                _ => return Err(format!("expected a string for BYTES, got {}", describe(v))),
            };
            let len = u32::try_from(s.len()).map_err(|_| "a BYTES element is longer than 4 GiB".to_string())?;
            o.extend_from_slice(&len.to_le_bytes());
            o.extend_from_slice(s.as_bytes());
            Ok(())
        },
    })
}

/// Step 3: converts the `expected` elements of the JSON text `data` (nested arrays, flattened
/// in order), streaming: no tree of values is built.
pub(super) fn convert_leaves(
    name: &str,
    shape: &[i64],
    dtype: DataType,
    data: &str,
    expected: u64,
    write: LeafWriter,
) -> Result<Vec<u8>, JsonDataError> {
    // Every leaf takes at least one byte of JSON text and a separator, so this never reserves
    // more than the body could fill, whatever the shape claims.
    let leaves_bound = expected.min(data.len() as u64 / 2 + 1);
    let size = dtype.element_size().unwrap_or(8) as u64;
    let mut out = Vec::with_capacity(usize::try_from(leaves_bound.saturating_mul(size)).unwrap_or(0));
    let (count, stop) = walk(data, expected, &mut out, write);
    let mismatch =
        |got| JsonDataError::CountMismatch { name: name.to_string(), shape: shape_string(shape), expected, got };
    match stop {
        None if count == expected => Ok(out),
        None => Err(mismatch(count)),
        Some(DataError::TooMany) => Err(mismatch(count_leaves(data))),
        Some(DataError::TooDeep) => Err(JsonDataError::TooDeep { name: name.to_string() }),
        Some(DataError::Bad { index, message }) => {
            Err(JsonDataError::BadElement { name: name.to_string(), index, message })
        }
    }
}

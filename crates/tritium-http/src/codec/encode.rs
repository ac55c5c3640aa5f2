//! Responses: the JSON header, then each binary output's bytes.

use super::*;

/// Encodes an inference response (outputs asked for as classifications arrive classified from
/// the core).
pub fn encode_infer_response(resp: InferResponse, specs: &OutputSpecs) -> Result<EncodedResponse, InferError> {
    let mut j = Vec::with_capacity(256);
    let mut binary = Vec::new();
    j.push(b'{');
    if !resp.id.is_empty() {
        json_out::key(&mut j, "id");
        json_out::string(&mut j, resp.id.as_bytes());
        j.push(b',');
    }
    json_out::key(&mut j, "model_name");
    json_out::string(&mut j, resp.model.as_bytes());
    j.push(b',');
    json_out::key(&mut j, "model_version");
    json_out::string(&mut j, resp.version.to_string().as_bytes());
    if !resp.parameters.is_empty() {
        j.push(b',');
        json_out::key(&mut j, "parameters");
        write_parameters(&mut j, &resp.parameters);
    }
    j.push(b',');
    json_out::key(&mut j, "outputs");
    j.push(b'[');
    for (i, output) in resp.outputs.into_iter().enumerate() {
        if i > 0 {
            j.push(b',');
        }
        let format = specs.format_for(&output.name);
        let (name, datatype, shape, data) = (output.name, output.datatype, output.shape, output.data);
        j.push(b'{');
        json_out::key(&mut j, "name");
        json_out::string(&mut j, name.as_bytes());
        j.push(b',');
        json_out::key(&mut j, "datatype");
        json_out::string(&mut j, datatype.wire_name().as_bytes());
        j.push(b',');
        json_out::key(&mut j, "shape");
        j.push(b'[');
        for (k, d) in shape.iter().enumerate() {
            if k > 0 {
                j.push(b',');
            }
            json_out::int(&mut j, *d);
        }
        j.push(b']');
        if format.shm {
            // The bytes are in the client's region already; Triton names the output only.
            j.push(b'}');
            continue;
        }
        j.push(b',');
        if format.binary {
            json_out::key(&mut j, "parameters");
            j.push(b'{');
            json_out::key(&mut j, "binary_data_size");
            json_out::uint(&mut j, data.len() as u64);
            j.push(b'}');
            if !data.is_empty() {
                binary.push(Bytes::from(data));
            }
        } else {
            let Some(count) = element_count(&shape) else {
                return Err(InferError::internal(format!(
                    "output '{name}' has an invalid shape {}",
                    shape_string(&shape)
                )));
            };
            json_out::key(&mut j, "data");
            write_output_data(&mut j, &name, datatype, &data, count)?;
        }
        j.push(b'}');
    }
    j.extend_from_slice(b"]}");
    Ok(EncodedResponse { json: j, binary })
}

fn write_parameters(j: &mut Vec<u8>, params: &[(String, ParamValue)]) {
    j.push(b'{');
    for (i, (k, v)) in params.iter().enumerate() {
        if i > 0 {
            j.push(b',');
        }
        json_out::key(j, k);
        match v {
            ParamValue::Bool(b) => json_out::boolean(j, *b),
            ParamValue::Int(n) => json_out::int(j, *n),
            ParamValue::Double(d) => json_out::double(j, *d),
            ParamValue::Str(s) => json_out::string(j, s.as_bytes()),
        }
    }
    j.push(b'}');
}

fn size_mismatch(name: &str) -> InferError {
    InferError::internal(format!(
        "Failed to write 'data' field: output tensor shape does not match size of output for '{name}'"
    ))
}

/// Writes `count` elements as a JSON array, checking the size first.
pub(crate) fn write_output_data(
    j: &mut Vec<u8>,
    name: &str,
    dtype: DataType,
    data: &[u8],
    count: u64,
) -> Result<(), InferError> {
    match dtype {
        DataType::Fp16 => {
            return Err(InferError::invalid(
                "sending FP16 data via JSON is not supported. Please use the binary data format for output",
            ))
        }
        DataType::Bf16 => {
            return Err(InferError::invalid(
                "sending BF16 data via JSON is not supported. Please use the binary data format for output",
            ))
        }
        _ => {}
    }
    if let Some(size) = dtype.element_size() {
        if count.checked_mul(size as u64) != Some(data.len() as u64) {
            return Err(size_mismatch(name));
        }
        j.reserve(data.len() / size * 4 + 2);
    }
    j.push(b'[');
    fn each<const N: usize>(j: &mut Vec<u8>, data: &[u8], mut f: impl FnMut(&mut Vec<u8>, [u8; N])) {
        for (i, c) in data.chunks_exact(N).enumerate() {
            if i > 0 {
                j.push(b',');
            }
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(j, a);
        }
    }
    match dtype {
        DataType::Bool => each::<1>(j, data, |j, a| json_out::boolean(j, a[0] != 0)),
        DataType::Uint8 => each::<1>(j, data, |j, a| json_out::uint(j, u64::from(a[0]))),
        DataType::Uint16 => each::<2>(j, data, |j, a| json_out::uint(j, u64::from(u16::from_le_bytes(a)))),
        DataType::Uint32 => each::<4>(j, data, |j, a| json_out::uint(j, u64::from(u32::from_le_bytes(a)))),
        DataType::Uint64 => each::<8>(j, data, |j, a| json_out::uint(j, u64::from_le_bytes(a))),
        DataType::Int8 => each::<1>(j, data, |j, a| json_out::int(j, i64::from(i8::from_le_bytes(a)))),
        DataType::Int16 => each::<2>(j, data, |j, a| json_out::int(j, i64::from(i16::from_le_bytes(a)))),
        DataType::Int32 => each::<4>(j, data, |j, a| json_out::int(j, i64::from(i32::from_le_bytes(a)))),
        DataType::Int64 => each::<8>(j, data, |j, a| json_out::int(j, i64::from_le_bytes(a))),
        DataType::Fp32 => each::<4>(j, data, |j, a| json_out::double(j, f64::from(f32::from_le_bytes(a)))),
        DataType::Fp64 => each::<8>(j, data, |j, a| json_out::double(j, f64::from_le_bytes(a))),
        DataType::Bytes => {
            let mut rest = data;
            for i in 0..count {
                if i > 0 {
                    j.push(b',');
                }
                let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(|| size_mismatch(name))?;
                let len = u32::from_le_bytes(*len) as usize;
                if tail.len() < len {
                    return Err(size_mismatch(name));
                }
                let (s, tail) = tail.split_at(len);
                // As Triton: the bytes go into the JSON string unchanged, UTF-8 or not.
                json_out::string(j, s);
                rest = tail;
            }
        }
        DataType::Fp16 | DataType::Bf16 => {}
    }
    j.push(b']');
    Ok(())
}

/// Serializes strings into Triton's `BYTES` form (a little-endian `u32` length before each).
pub fn serialize_bytes<I, T>(elements: I) -> Vec<u8>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    let mut out = Vec::new();
    for e in elements {
        let e = e.as_ref();
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    out
}

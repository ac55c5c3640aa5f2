//! The system and CUDA shared-memory extensions: status, register, unregister.

use super::*;

// ---- the system shared memory extension ----

pub(super) fn system_shm<B: Backend>(backend: &B) -> Result<&tritium_server::shm::ShmRegistry, HttpError> {
    backend.system_shm().ok_or_else(|| not_supported("the system shared memory extension"))
}

/// One region as Triton's status lists it.
#[derive(Serialize)]
struct RegionJson<'a> {
    name: &'a str,
    key: &'a str,
    offset: u64,
    byte_size: u64,
}

pub(super) async fn system_shm_status<B: Backend>(State(s): St<B>, Params(p): Params) -> HttpResult {
    let regions = system_shm(&*s.backend)?.status(p.get("region").map(String::as_str).unwrap_or_default())?;
    let json: Vec<RegionJson<'_>> = regions
        .iter()
        .map(|r| RegionJson { name: &r.name, key: &r.key, offset: r.offset, byte_size: r.byte_size })
        .collect();
    json_ok(&json)
}

/// What registering either kind of region starts with, in Triton's order: client shared memory
/// is allowed, the path names a region, and the body is JSON (empty is an empty object). Then a
/// field reader with Triton's texts for a missing or mistyped field.
async fn registration<B: Backend>(
    s: &AppState<B>,
    p: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Body,
    kind: &str,
) -> Result<(String, Fields), HttpError> {
    system_shm(&*s.backend)?.check_allowed()?;
    let Some(region) = p.get("region") else {
        return Err(HttpError::from(InferError::invalid(format!(
            "'region name' is necessary to register {kind} shared memory region"
        ))));
    };
    let body = read_body(headers, body, s.options.max_input_size, BodyKind::Json).await?;
    Ok((region.clone(), Fields(optional_json(&body)?.unwrap_or(Value::Null))))
}

/// A registration's JSON body.
struct Fields(Value);

impl Fields {
    /// Field `name`, which the request must have.
    fn required(&self, name: &str) -> Result<&Value, InferError> {
        self.0
            .get(name)
            .ok_or_else(|| InferError::invalid(format!("Shared memory register request has no '{name}' field")))
    }

    fn uint(name: &str, v: &Value) -> Result<u64, InferError> {
        v.as_u64().ok_or_else(|| InferError::invalid(format!("Unable to parse '{name}': expected an unsigned integer")))
    }
}

/// Triton's `HandleSystemSharedMemory` for `register`: a JSON body with `key`, optional
/// `offset`, and `byte_size`.
pub(super) async fn system_shm_register<B: Backend>(
    State(s): St<B>,
    Params(p): Params,
    headers: HeaderMap,
    body: Body,
) -> HttpResult {
    let (region, fields) = registration(&s, &p, &headers, body, "system").await?;
    let key = fields.required("key")?;
    let key = key.as_str().ok_or_else(|| InferError::invalid("Unable to parse 'key': expected a string"))?;
    let offset = fields.0.get("offset").map(|v| Fields::uint("offset", v)).transpose()?.unwrap_or(0);
    let byte_size = Fields::uint("byte_size", fields.required("byte_size")?)?;
    system_shm(&*s.backend)?.register(&region, key, offset, byte_size)?;
    Ok(json_response(StatusCode::OK, Body::empty()))
}

pub(super) async fn system_shm_unregister<B: Backend>(State(s): St<B>, Params(p): Params) -> HttpResult {
    let shm = system_shm(&*s.backend)?;
    match p.get("region") {
        Some(region) => shm.unregister(region),
        None => shm.unregister_all(),
    }
    Ok(json_response(StatusCode::OK, Body::empty()))
}

// ---- the CUDA shared memory extension ----

/// One CUDA region as Triton's status lists it.
#[derive(Serialize)]
struct CudaRegionJson<'a> {
    name: &'a str,
    device_id: u64,
    byte_size: u64,
}

pub(super) async fn cuda_shm_status<B: Backend>(State(s): St<B>, Params(p): Params) -> HttpResult {
    let regions = system_shm(&*s.backend)?.cuda_status(p.get("region").map(String::as_str).unwrap_or_default())?;
    let json: Vec<CudaRegionJson<'_>> = regions
        .iter()
        .map(|r| CudaRegionJson { name: &r.name, device_id: r.device_id, byte_size: r.byte_size })
        .collect();
    json_ok(&json)
}

/// Triton's `HandleCudaSharedMemory` for `register`: a JSON body with `raw_handle: {b64}`
/// (a base64 `cudaIpcMemHandle_t`, as tritonclient sends it), `device_id` and `byte_size`.
pub(super) async fn cuda_shm_register<B: Backend>(
    State(s): St<B>,
    Params(p): Params,
    headers: HeaderMap,
    body: Body,
) -> HttpResult {
    let (region, fields) = registration(&s, &p, &headers, body, "cuda").await?;
    let b64 = fields.required("raw_handle")?.get("b64").and_then(Value::as_str).ok_or_else(|| {
        InferError::invalid("Unable to parse 'raw_handle': expected an object with a base64 string 'b64'")
    })?;
    let byte_size = Fields::uint("byte_size", fields.required("byte_size")?)?;
    let device_id = Fields::uint("device_id", fields.required("device_id")?)?;
    let handle = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| InferError::invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"))?;
    let device_id = i64::try_from(device_id).unwrap_or(i64::MAX);
    system_shm(&*s.backend)?.register_cuda(&region, &handle, device_id, byte_size)?;
    Ok(json_response(StatusCode::OK, Body::empty()))
}

pub(super) async fn cuda_shm_unregister<B: Backend>(State(s): St<B>, Params(p): Params) -> HttpResult {
    let shm = system_shm(&*s.backend)?;
    match p.get("region") {
        Some(region) => shm.unregister_cuda(region),
        None => shm.unregister_all_cuda(),
    }
    Ok(json_response(StatusCode::OK, Body::empty()))
}

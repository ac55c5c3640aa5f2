//! Live Python stacks of a model's stubs ([`Server::stacks`]): what `tritium stack`, the admin
//! RPC and the HTTP endpoint show. Each stub answers from a native thread that needs no GIL
//! (`tritium_host::StackProbe`), so a stub stuck in C code that holds the GIL still answers.

use super::*;

/// How long one request for a stub's stacks waits for its answer.
pub const STACKS_TIMEOUT: Duration = Duration::from_secs(3);

impl Server {
    /// The Python stacks of every stub of `model` (every version), or of one instance: by name
    /// (`add_sub_0_0`), or by its position among the model's instances as `tritium stubs` lists
    /// them (`0`, `1`, ...). The stubs are asked at once; one that does not answer within
    /// [`STACKS_TIMEOUT`] gets why instead of its stacks.
    pub async fn stacks(&self, model: &str, instance: Option<&str>) -> Result<Vec<InstanceStacks>, InferError> {
        let mut all = Vec::new();
        {
            let models = self.models();
            let entry = models
                .get(model)
                .ok_or_else(|| InferError::not_found(format!("Request for unknown model: '{model}' is not found")))?;
            for (v, ver) in &entry.versions {
                for i in ver.ctx.instances.locked().iter() {
                    all.push((*v, i.spec.name.clone(), i.stack_probe()));
                }
            }
        }
        all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        if let Some(wanted) = instance {
            let by_name: Vec<_> = all.iter().filter(|(_, name, _)| name == wanted).cloned().collect();
            all = match (by_name.is_empty(), wanted.parse::<usize>()) {
                (false, _) => by_name,
                (true, Ok(n)) if n < all.len() => vec![all.swap_remove(n)],
                _ => {
                    let names: Vec<&str> = all.iter().map(|(_, n, _)| n.as_str()).collect();
                    return Err(InferError::not_found(format!(
                        "model '{model}' has no instance '{wanted}' (its instances: {}); name one as `tritium stubs` \
                         lists it, or give its position from 0",
                        names.join(", ")
                    )));
                }
            };
        }
        let asked = all.into_iter().map(|(version, name, probe)| {
            let model = model.to_string();
            tokio::task::spawn_blocking(move || {
                let (pid, stacks) = match probe {
                    Some((pid, probe)) => (Some(pid), probe.stacks(STACKS_TIMEOUT).map_err(|e| e.to_string())),
                    None => (None, Err("no stub process runs for this instance now".to_string())),
                };
                InstanceStacks { model, version, instance: name, pid, stacks }
            })
        });
        let mut out = Vec::new();
        for task in asked.collect::<Vec<_>>() {
            out.push(
                task.await.map_err(|e| InferError::internal(format!("asking a stub for its stacks failed: {e}")))?,
            );
        }
        Ok(out)
    }
}

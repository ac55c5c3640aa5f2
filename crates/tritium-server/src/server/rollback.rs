//! Rolling back a bad model update. After a reload switches traffic to the new versions, the
//! previous ones stay loaded, drained but alive, for the grace period (`--model-update-grace-secs`,
//! per model `model_update_grace_secs`; the entry's `standby`). A watcher counts the new
//! instances' crashes meanwhile: at [`ROLLBACK_CRASHES`], or when one of them gives up, the
//! previous versions serve again, the requests still queued at the new ones move to them, the
//! new ones are retired, and the index and the log say why. When the grace period passes quietly,
//! the previous versions are retired.
//!
//! A later load or unload of the model takes over: it retires the standby versions itself, and
//! the watcher, seeing that the versions it watches no longer serve, ends.

use super::*;

/// Crashes of an update's instances, together, within the grace period that roll it back.
pub(crate) const ROLLBACK_CRASHES: u64 = 2;

/// How often the watcher looks at the new instances.
const TICK: Duration = Duration::from_millis(20);

pub use crate::instance::DEFAULT_MODEL_UPDATE_GRACE_SECS;

/// Watches model `name`'s new versions `new` for the grace period after a reload switched to
/// them; their predecessors wait in the entry's `standby`.
pub(super) fn watch_update(server: Server, name: String, new: Vec<Arc<Version>>, grace: Duration) {
    let Some(runtime) = server.core.runtime.clone() else {
        return;
    };
    runtime.spawn(async move {
        let deadline = tokio::time::Instant::now() + grace;
        let mut crashes = Crashes::new(&new);
        let verdict = loop {
            if !still_serving(&server, &name, &new) {
                return;
            }
            if let Some(reason) = crashes.update() {
                break Some(reason);
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(TICK).await;
        };
        let retired = {
            let mut models = server.models_mut();
            let Some(entry) = models.get_mut(&name) else { return };
            if !serves(entry, &new) {
                return;
            }
            match &verdict {
                None => std::mem::take(&mut entry.standby),
                Some(reason) => {
                    if entry.standby.is_empty() {
                        return;
                    }
                    let text = format!(
                        "rolled back: the update's instances crashed {} times within {:.0} s of serving \
                         ({reason}); the previous version serves again",
                        crashes.count,
                        grace.as_secs_f64()
                    );
                    error!(model = %name, "{text}");
                    entry.rolled_back = Some(text);
                    let bad = std::mem::replace(&mut entry.versions, std::mem::take(&mut entry.standby));
                    requeue(&bad, &entry.versions);
                    bad
                }
            }
        };
        if verdict.is_none() {
            info!(model = %name, "update grace period over; the previous version retires");
        }
        retire_all(retired.into_values()).await;
    });
}

/// Whether the entry still serves `new` (no later load or unload replaced it).
fn serves(entry: &Entry, new: &[Arc<Version>]) -> bool {
    entry.versions.len() == new.len() && entry.versions.values().zip(new).all(|(a, b)| Arc::ptr_eq(a, b))
}

fn still_serving(server: &Server, name: &str, new: &[Arc<Version>]) -> bool {
    server.models().get(name).is_some_and(|e| serves(e, new))
}

/// Moves the requests queued at the bad versions to the restored version of the same number,
/// or the newest restored one. A request the restored queue refuses is dropped, which answers
/// it with an error.
fn requeue(bad: &BTreeMap<i64, Arc<Version>>, restored: &BTreeMap<i64, Arc<Version>>) {
    for (v, version) in bad {
        let Some(target) = restored.get(v).or_else(|| restored.values().next_back()) else { continue };
        for pending in version.ctx.queue.close() {
            let _ = target.ctx.queue.push(pending);
        }
    }
}

/// The crashes of a set of versions' instances since the watch began.
struct Crashes {
    instances: Vec<(Arc<crate::instance::Instance>, u64)>,
    count: u64,
    /// The reason of the last crash seen (an instance forgets it once it is ready again).
    reason: String,
}

impl Crashes {
    fn new(versions: &[Arc<Version>]) -> Self {
        let instances = versions
            .iter()
            .flat_map(|v| v.ctx.instances.locked().clone())
            .map(|i| {
                let restarts = i.restarts();
                (i, restarts)
            })
            .collect();
        Self { instances, count: 0, reason: String::new() }
    }

    /// Counts again; the last crash's reason once they reach [`ROLLBACK_CRASHES`] or an
    /// instance gave up.
    fn update(&mut self) -> Option<String> {
        let mut count = 0;
        let mut gave_up = false;
        for (instance, at_start) in &self.instances {
            let state = instance.state();
            let crashed = matches!(state, InstanceState::Crashed | InstanceState::Failed);
            count += instance.restarts().saturating_sub(*at_start) + u64::from(crashed);
            gave_up |= state == InstanceState::Failed;
            let reason = instance.reason();
            if let Some(line) = reason.lines().next().filter(|l| !l.is_empty()) {
                self.reason = line.to_string();
            }
        }
        self.count = self.count.max(count);
        (self.count >= ROLLBACK_CRASHES || gave_up).then(|| self.reason.clone())
    }
}

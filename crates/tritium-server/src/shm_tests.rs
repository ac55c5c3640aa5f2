//! Unit tests of client shared memory: registration, lookups of inputs and outputs, region
//! checks, and what a region's file may and may not do.

use std::sync::atomic::AtomicU32;

use tritium_ipc::REGION_BIT;

use super::*;

/// A POSIX shared memory object of `len` bytes, unlinked when dropped.
struct Object(String);

impl Object {
    fn new(tag: &str, len: u64) -> Self {
        let key = format!("/tritium-shm-test-{}-{tag}", std::process::id());
        let fd = nix::sys::mman::shm_open(
            key.as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .expect("shm_open");
        nix::unistd::ftruncate(&fd, len as libc::off_t).expect("ftruncate");
        Self(key)
    }

    fn truncate(&self, len: u64) {
        let fd = nix::sys::mman::shm_open(self.0.as_str(), OFlag::O_RDWR, Mode::empty()).expect("open");
        nix::unistd::ftruncate(&fd, len as libc::off_t).expect("ftruncate");
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let _ = nix::sys::mman::shm_unlink(self.0.as_str());
    }
}

fn message(r: Result<impl std::fmt::Debug, InferError>) -> (ErrorKind, String) {
    let e = r.expect_err("an error");
    (e.kind, e.message)
}

#[test]
fn registration_checks_key_name_and_file_bounds_with_tritons_texts() {
    let obj = Object::new("reg", 4096);
    let shm = ShmRegistry::default();
    assert_eq!(
        message(shm.register("r", "/no-such-tritium-key", 0, 8)),
        (ErrorKind::Internal, "Unable to open shared memory region: '/no-such-tritium-key'".into())
    );
    assert_eq!(
        message(shm.register("r", &obj.0, 4000, 97)),
        (ErrorKind::InvalidArg, "failed to register shared memory region 'r': invalid args".into())
    );
    assert_eq!(
        message(shm.register("r", &obj.0, u64::MAX, 2)).1,
        "failed to register shared memory region 'r': invalid args"
    );
    assert_eq!(
        message(shm.register("r", "//", 0, 8)).1,
        "cannot register shared memory region 'r' - invalid shm key '//'"
    );
    assert!(message(shm.register("r", "/triton_python_backend_shm_region_x", 0, 8))
        .1
        .contains("contains the reserved prefix 'triton_python_backend_shm_region_'"));
    shm.register("r", &obj.0, 100, 1000).expect("register");
    assert_eq!(
        message(shm.register("r", &obj.0, 0, 8)),
        (ErrorKind::AlreadyExists, "shared memory region 'r' already in manager".into())
    );
    assert_eq!(
        shm.status("").expect("all"),
        [RegionStatus { name: "r".into(), key: obj.0.clone(), offset: 100, byte_size: 1000 }]
    );
    assert_eq!(
        message(shm.status("x")),
        (ErrorKind::NotFound, "Unable to find system shared memory region: 'x'".into())
    );
}

#[test]
fn registration_can_be_turned_off_with_tritons_text() {
    let obj = Object::new("off", 4096);
    let shm = ShmRegistry::default();
    shm.register("before", &obj.0, 0, 64).expect("allowed by default");
    shm.set_allowed(false);
    assert_eq!(message(shm.register("r", &obj.0, 0, 64)), (ErrorKind::Unsupported, CLIENT_SHM_DISABLED.into()));
    // Refused before the key is even looked at, as in Triton.
    assert_eq!(message(shm.register("r", "//", 0, 64)).1, CLIENT_SHM_DISABLED);
    assert_eq!(shm.status("").expect("status").len(), 1, "status still answers");
    shm.unregister("before");
    shm.set_allowed(true);
    shm.register("r", &obj.0, 0, 64).expect("allowed again");
}

#[test]
fn every_use_is_bounds_checked_with_tritons_texts() {
    let obj = Object::new("use", 4096);
    let shm = ShmRegistry::default();
    shm.register("r", &obj.0, 0, 1024).expect("register");
    assert_eq!(
        message(shm.input("nope", 0, 4)),
        (ErrorKind::NotFound, "Unable to find shared memory region: 'nope'".into())
    );
    assert_eq!(message(shm.input("r", 1024, 0)).1, "Invalid offset for shared memory region: 'r'");
    assert_eq!(message(shm.output("r", 1000, 25)).1, "Invalid offset + byte size for shared memory region: 'r'");
    assert!(message(shm.input("r", 8, u64::MAX)).1.starts_with("Integer overflow detected: byte_size"));
    assert_eq!(shm.input("r", 1000, 24).expect("the last 24 bytes").len(), 24);
    // The client shrinks its file under the registration: the next use is refused.
    obj.truncate(512);
    assert!(message(shm.input("r", 0, 4)).1.contains("is no longer valid: its file has 512 bytes"));
}

#[test]
fn inputs_alias_the_region_and_outputs_are_written_into_it() {
    let obj = Object::new("alias", 8192);
    let shm = ShmRegistry::default();
    shm.register("r", &obj.0, 4096, 4096).expect("register");
    let target = shm.output("r", 16, 8).expect("target");
    target.write("OUT", b"abcdefgh").expect("fits");
    assert_eq!(
        message(target.write("OUT", b"123456789")),
        (
            ErrorKind::Internal,
            "shared memory size specified with the request for output 'OUT' (8 bytes) should be at least 9 bytes to hold the results"
                .into()
        )
    );
    let input = shm.input("r", 16, 8).expect("input");
    assert_eq!(&input[..], b"abcdefgh");
    let (region, offset) = lookup(input.as_ptr(), input.len()).expect("in a region");
    assert_eq!((offset, region.byte_size(), region.file_offset()), (16, 4096, 4096));
    assert!(lookup(input.as_ptr(), 4096).is_none(), "past the end of the mapping");
    let elsewhere = [0u8; 8];
    assert!(lookup(elsewhere.as_ptr(), 8).is_none());
}

#[test]
fn cuda_regions_share_the_namespace_and_say_why_they_cannot_be_registered() {
    let obj = Object::new("cuda", 4096);
    let shm = ShmRegistry::default();
    shm.register("sys", &obj.0, 0, 64).expect("register");
    assert_eq!(
        message(shm.register_cuda("sys", &[0; 64], 0, 64)),
        (ErrorKind::AlreadyExists, "shared memory region 'sys' already in manager".into())
    );
    assert_eq!(
        message(shm.register_cuda("g", &[0; 63], 0, 64)),
        (ErrorKind::InvalidArg, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t".into())
    );
    let (kind, text) = message(shm.register_cuda("g", &[0; 64], 0, 64));
    assert_eq!(kind, ErrorKind::InvalidArg);
    match tritium_cuda::cuda() {
        Err(e) => {
            assert_eq!(text, format!("failed to register CUDA shared memory region: 'g', GPUs not supported ({e})"))
        }
        Ok(_) => assert!(text.starts_with("failed to register shared memory region: invalid args"), "{text}"),
    }
    assert_eq!(
        message(shm.cuda_status("sys")),
        (
            ErrorKind::NotFound,
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory".into()
        )
    );
    assert_eq!(message(shm.cuda_status("g")).1, "Unable to find cuda shared memory region: 'g'");
    assert!(shm.cuda_status("").expect("all").is_empty());
    // Unregistering a CUDA name leaves a system region of that name alone, as in Triton.
    shm.unregister_cuda("sys");
    shm.unregister_all_cuda();
    assert_eq!(shm.status("").expect("status").len(), 1);
    assert!(shm.output("sys", 0, 8).expect("target").system().is_some(), "still the system region");
    shm.set_allowed(false);
    assert_eq!(message(shm.register_cuda("g", &[0; 64], 0, 64)).1, CLIENT_SHM_DISABLED);
}

#[test]
fn registrations_of_one_range_of_one_file_share_a_mapping() {
    let obj = Object::new("share", 8192);
    let shm = ShmRegistry::default();
    for i in 0..50 {
        shm.register(&format!("r{i}"), &obj.0, 0, 4096).expect("register");
    }
    shm.register("other", &obj.0, 4096, 4096).expect("another range");
    let a = shm.output("r0", 0, 8).expect("r0");
    let b = shm.output("r49", 0, 8).expect("r49");
    let c = shm.output("other", 0, 8).expect("other");
    let id = |t: &ShmTarget| t.system().expect("system").0.id();
    assert_eq!(id(&a), id(&b), "one mapping for one range");
    assert_ne!(id(&a), id(&c));
    assert_eq!((a.region_name(), b.region_name()), ("r0", "r49"), "each keeps its own name");
    let status = shm.status("r49").expect("status");
    assert_eq!(status, [RegionStatus { name: "r49".into(), key: obj.0.clone(), offset: 0, byte_size: 4096 }]);
    // Unregistering one name leaves the others' shared mapping alone.
    shm.unregister("r0");
    assert_eq!(&shm.input("r1", 0, 3).expect("still mapped")[..], &[0, 0, 0]);
    let shared = id(&a);
    assert!(is_live(shared));
    drop((a, b, c));
    shm.unregister_all();
    assert!(!is_live(shared), "unmapped with its last name and user");
}

#[test]
fn a_shrunk_region_of_a_dead_stub_is_found_by_its_ids() {
    let obj = Object::new("shrunk", 4096);
    let shm = ShmRegistry::default();
    shm.register("r", &obj.0, 0, 4096).expect("register");
    let target = shm.output("r", 0, 8).expect("target");
    let (region, desc) = target.system().expect("system");
    let (id, output_id) = (region.id(), desc.segment);
    assert_ne!(id, output_id, "inputs and outputs are mapped under ids of their own");
    assert_eq!(shrunk_region(&[id, output_id]), None, "intact");
    obj.truncate(100);
    assert_eq!(shrunk_region(&[id]), Some(obj.0.clone()));
    assert_eq!(shrunk_region(&[output_id]), Some(obj.0.clone()));
    assert_eq!(shrunk_region(&[REGION_BIT | 0x3fff_fff0]), None, "another stub's regions");
    assert!(message(target.write("OUT", b"12345678")).1.contains("is no longer valid: its file has 100 bytes"));
}

#[test]
fn registrations_past_the_limit_are_refused_naming_the_flag() {
    let obj = Object::new("cap", 4096);
    let shm = ShmRegistry::default();
    shm.set_max_regions(3);
    for i in 0..3 {
        shm.register(&format!("r{i}"), &obj.0, i * 64, 64).expect("under the limit");
    }
    assert_eq!(
        message(shm.register("r3", &obj.0, 0, 64)),
        (
            ErrorKind::Unavailable,
            "cannot register shared memory region 'r3': 3 regions are registered, the limit (server flag \
             --max-shm-regions); unregister regions that are no longer used"
                .into()
        )
    );
    assert!(message(shm.register_cuda("g", &[0; 64], 0, 64)).1.contains("--max-shm-regions"), "both kinds");
    assert_eq!(
        message(shm.register("r0", &obj.0, 0, 64)).0,
        ErrorKind::AlreadyExists,
        "a taken name is still reported as taken"
    );
    shm.unregister("r1");
    shm.register("r3", &obj.0, 0, 64).expect("room again");
}

#[test]
fn is_live_never_drops_the_last_reference_under_the_lock() {
    // A region whose last request ends while another thread asks whether it is live: the old
    // `is_live` upgraded under `LIVE` and could drop the last `Arc` there, and `Region::drop`
    // locks `LIVE` again (a self-deadlock). The window is a few instructions wide and cannot
    // be forced from outside `is_live`, so this races it many times under a watchdog (a
    // guard, not a reproduction: the old code passed it in the runs made).
    let obj = Object::new("race", 4096);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let key = obj.0.clone();
    std::thread::spawn(move || {
        let shm = ShmRegistry::default();
        let stop = Arc::new(AtomicBool::new(false));
        let current = Arc::new(AtomicU32::new(0));
        let asker = {
            let (stop, current) = (stop.clone(), current.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = is_live(current.load(Ordering::Relaxed));
                }
            })
        };
        for i in 0..3000u64 {
            shm.register("r", &key, i % 64, 64).expect("register");
            let input = shm.input("r", 0, 8).expect("input");
            let (region, _) = lookup(input.as_ptr(), 8).expect("live");
            current.store(region.id(), Ordering::Relaxed);
            drop(region);
            shm.unregister("r");
            assert!(is_live(current.load(Ordering::Relaxed)), "the request still holds it");
            drop(input); // the last reference, raced against the asker
        }
        stop.store(true, Ordering::Relaxed);
        asker.join().expect("asker");
        let _ = done_tx.send(());
    });
    done_rx.recv_timeout(std::time::Duration::from_secs(60)).expect("is_live and Region::drop deadlocked");
}

#[test]
fn unregistering_frees_the_name_at_once_and_the_mapping_with_its_last_user() {
    let obj = Object::new("life", 4096);
    let shm = ShmRegistry::default();
    shm.register("r", &obj.0, 0, 4096).expect("register");
    let input = shm.input("r", 0, 4).expect("input");
    let (region, _) = lookup(input.as_ptr(), 4).expect("live");
    let weak = Arc::downgrade(&region);
    drop(region);
    shm.unregister("r");
    shm.unregister("r"); // not registered: no error, as in Triton
    assert!(shm.status("").expect("status").is_empty());
    // The name is free again while the old mapping still serves its request.
    shm.register("r", &obj.0, 0, 64).expect("register again");
    assert_eq!(input.len(), 4);
    assert!(weak.upgrade().is_some(), "a request still holds it");
    let addr = input.as_ptr();
    drop(input);
    assert!(weak.upgrade().is_none(), "the last user unmapped it");
    assert!(lookup(addr, 1).is_none_or(|(r, _)| r.byte_size() == 64));
    shm.unregister_all();
    assert!(shm.status("").expect("status").is_empty());
}

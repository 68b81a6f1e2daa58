//! The testbeds, as CI runs them: three nodes in network namespaces on a
//! bridge (scripts/testbed-netns.sh), and three Docker containers
//! (docker/testbed.sh) where a Docker engine is present. Each runs the
//! cluster check: all-pairs byte-exact checks, a node stopped and reported
//! down within the liveness deadline, restarted and rejoined.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
}

/// Runs `script` for `nodes` nodes with `extra_env`: whether it passed, and
/// what it printed.
fn run_script(script: &str, nodes: &str, extra_env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new("bash")
        .arg(root().join(script))
        .arg(nodes)
        .env("EMXD", env!("CARGO_BIN_EXE_emxd"))
        .env("EMXCTL", env!("CARGO_BIN_EXE_emxctl"))
        .envs(extra_env.iter().copied())
        .output()
        .expect("run bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn namespace_testbed_3_nodes() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the namespace testbed needs root (network namespaces): run the tests as root"
    );
    // What a run killed outright left, named after its pid, gone but not
    // yet reaped (a zombie): a namespace with its daemon still running in it
    // and a veth into it, a bridge, a work directory. The next run removes
    // them.
    let mut dead = zombie();
    let tag = format!("emxt{}", dead.id());
    let (ns, br, veth) = (format!("{tag}n1"), format!("{tag}br"), format!("{tag}v1"));
    let work = format!("/tmp/emx-testbed.{}.stale", dead.id());
    let ip = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(ip(&["netns", "add", &ns]));
    assert!(ip(&["link", "add", &br, "type", "bridge"]));
    assert!(ip(&[
        "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns
    ]));
    let mut daemon = Command::new("ip")
        .args(["netns", "exec", &ns, "sleep", "600"])
        .spawn()
        .expect("run sleep in the namespace");
    // In it before the script sweeps.
    let t = std::time::Instant::now();
    while Command::new("ip")
        .args(["netns", "pids", &ns])
        .output()
        .map_or(true, |o| o.stdout.is_empty())
    {
        assert!(t.elapsed().as_secs() < 10, "sleep never entered {ns}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::fs::create_dir_all(&work).unwrap();
    let (ok, text) = run_script("scripts/testbed-netns.sh", "3", &[]);
    let ns_there = Path::new("/run/netns").join(&ns).exists();
    let br_there = ip(&["link", "show", &br]);
    let veth_there = ip(&["link", "show", &veth]);
    let daemon_ran = daemon.try_wait().unwrap().is_none();
    let work_there = Path::new(&work).exists();
    let _ = daemon.kill();
    let _ = daemon.wait();
    ip(&["netns", "del", &ns]);
    ip(&["link", "del", &br]);
    ip(&["link", "del", &veth]);
    let _ = std::fs::remove_dir_all(&work);
    dead.wait().expect("reap the zombie");
    assert!(ok, "{text}");
    assert!(text.contains("cluster check passed"), "{text}");
    assert!(
        !ns_there && !br_there && !veth_there && !daemon_ran && !work_there,
        "a killed run's leftovers outlived the next run: namespace {ns_there}, bridge \
         {br_there}, veth {veth_there}, process in the namespace {daemon_ran}, work \
         directory {work_there}"
    );
}

/// A second Ctrl-C while the namespace testbed tears down does not cut the
/// teardown short: the namespaces, the bridge and the work directory go.
/// (The INT trap stayed set during the teardown, so a second signal ended
/// its `wait` for the daemons and exited before anything was removed.) The
/// daemons here are stand-ins that ignore SIGTERM and SIGINT for 3 s, which
/// holds the teardown in that wait.
#[test]
fn namespace_testbed_interrupted_twice_still_cleans_up() {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    assert!(
        nix::unistd::geteuid().is_root(),
        "the namespace testbed needs root (network namespaces): run the tests as root"
    );
    let dir = std::env::temp_dir().join(format!("emx-tb-int-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let slow = dir.join("slow-emxd");
    std::fs::write(&slow, "#!/bin/bash\ntrap '' TERM INT\nsleep 3\n").unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&slow, mode).unwrap();
    let mut child = Command::new("bash")
        .arg(root().join("scripts/testbed-netns.sh"))
        .arg("2")
        .env("EMXD", &slow)
        .env("EMXCTL", "true")
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run bash");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("making") {
        line.clear();
    }
    assert!(
        line.contains("making"),
        "the testbed did not start: {line:?}"
    );
    // Its stand-in daemons started; it waits for their sockets.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let group = Pid::from_raw(pid as i32);
    killpg(group, Signal::SIGINT).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = killpg(group, Signal::SIGINT);
    let status = child.wait().unwrap();
    let tag = format!("emxt{pid}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&netns.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&tag))
        .map(str::to_owned)
        .collect();
    let br = Command::new("ip")
        .args(["link", "show", &format!("{tag}br")])
        .output()
        .is_ok_and(|o| o.status.success());
    let work = std::fs::read_dir("/tmp")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("emx-testbed.{pid}."))
        });
    // (What a failed teardown left goes now, for the next tests.)
    for ns in &left {
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
    }
    let _ = Command::new("ip")
        .args(["link", "del", &format!("{tag}br")])
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(
        left.is_empty() && !br && !work,
        "left behind: namespaces {left:?}, bridge {br}, work directory {work}"
    );
}

/// A child that has exited and is not reaped yet: its pid names a process
/// that is gone, which `kill -0` still finds. Reap it with `wait`.
fn zombie() -> std::process::Child {
    let mut c = Command::new("true").spawn().expect("run true");
    let stat = format!("/proc/{}/stat", c.id());
    for _ in 0..1000 {
        let state = std::fs::read_to_string(&stat).unwrap_or_default();
        if state
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            return c;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _ = c.kill();
    let _ = c.wait();
    panic!("`true` did not exit within 5 s");
}

/// Whether Docker with Compose answers here; says why `test` is skipped when
/// not. With `EMX_REQUIRE_DOCKER=1` (as CI sets it, where Docker runs) a
/// missing Docker fails the test instead: a skip there would pass unseen.
fn docker_and_compose(test: &str) -> bool {
    let skip = |why: &str| {
        assert!(
            std::env::var("EMX_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "{test}: {why}, and EMX_REQUIRE_DOCKER=1 requires it"
        );
        eprintln!("SKIPPED {test}: {why}");
        false
    };
    if !docker(&["info", "--format", "{{.ServerVersion}}"]).0 {
        return skip("no Docker engine answers `docker info` here");
    }
    let compose = |args: &[&str]| {
        Command::new(args[0])
            .args(&args[1..])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !compose(&["docker", "compose", "version"]) && !compose(&["docker-compose", "version"]) {
        return skip(
            "Docker answers, but without Compose (install the docker compose plugin or \
             docker-compose)",
        );
    }
    true
}

#[test]
fn docker_testbed_3_nodes() {
    if !docker_and_compose("docker_testbed_3_nodes") {
        return;
    }
    // What a run killed outright would have left (its network, labelled
    // with its pid, gone but not yet reaped), and what a kept run left: the
    // next run removes the first and leaves the second.
    // (What a killed run of this test planted goes first.)
    remove_labelled("emx.test=planted");
    let mut zombie = zombie();
    let dead = zombie.id();
    let plant = |name: &str, keep: bool| {
        let mut args = vec!["network".to_string(), "create".into()];
        for label in [
            format!("emx.testbed={dead}"),
            format!("emx.owner={}", owner()),
            "emx.test=planted".into(),
        ] {
            args.extend(["--label".into(), label]);
        }
        if keep {
            args.extend(["--label".into(), "emx.keep=1".into()]);
        }
        args.push(name.into());
        assert!(docker(&args.iter().map(String::as_str).collect::<Vec<_>>()).0);
    };
    let (stale, kept) = (format!("emxtb{dead}_stale"), format!("emxtb{dead}_kept"));
    plant(&stale, false);
    plant(&kept, true);

    let (ok, text) = run_script("docker/testbed.sh", "3", &[]);
    let kept_there = docker(&["network", "inspect", &kept]).0;
    let stale_there = docker(&["network", "inspect", &stale]).0;
    docker(&["network", "rm", &stale, &kept]);
    zombie.wait().expect("reap the zombie");
    assert!(ok, "{text}");
    assert!(text.contains("cluster check passed"), "{text}");
    assert!(!stale_there, "a killed run's network outlived the next run");
    assert!(kept_there, "the next run removed a kept run's network");
    let project = project_of(&text);
    assert_eq!(
        left_of(&project),
        "",
        "{project} left containers or networks"
    );
}

/// The image build removes earlier builds' images once they are old enough
/// (`EMX_IMAGE_KEEP_S`, here 0) and no container uses them: one was left for
/// every change of the code. The image just built, and one a container
/// still uses, stay.
#[test]
fn docker_testbed_image_build_removes_earlier_images() {
    if !docker_and_compose("docker_testbed_image_build_removes_earlier_images") {
        return;
    }
    let tag = |what: &str| format!("emx-node:0e{what}{}", std::process::id());
    let (old, used) = (tag("01d"), tag("05ed"));
    let dir = std::env::temp_dir().join(format!("emx-img-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Dockerfile"), "FROM scratch\nCOPY f /f\n").unwrap();
    std::fs::write(dir.join("f"), "earlier").unwrap();
    for t in [&old, &used] {
        assert!(docker(&["build", "-q", "-t", t, dir.to_str().unwrap()]).0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let container = format!("emx-img-user-{}", std::process::id());
    assert!(docker(&["create", "--name", &container, &used, "/f"]).0);
    let out = Command::new("bash")
        .arg(root().join("docker/build-image.sh"))
        .env("EMX_IMAGE_KEEP_S", "0")
        .output()
        .expect("run bash");
    let built = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let exists = |t: &str| docker(&["image", "inspect", t]).0;
    let (old_there, used_there, built_there) = (exists(&old), exists(&used), exists(&built));
    docker(&["rm", "-f", &container]);
    docker(&["rmi", "-f", &old, &used]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!old_there, "an earlier build's image stayed");
    assert!(used_there, "an image a container uses was removed");
    assert!(built_there, "the image just built was removed: {built}");
}

/// `EMX_KEEP`: the containers stay up, with the files they mount, and the
/// command the script gives removes them.
#[test]
fn docker_testbed_kept_stays_until_removed() {
    if !docker_and_compose("docker_testbed_kept_stays_until_removed") {
        return;
    }
    // What a killed run of this test kept goes first (no run sweeps kept ones).
    remove_labelled("emx.keep=emx-test");
    for dir in std::fs::read_dir("/tmp").expect("list /tmp").flatten() {
        let kept = dir.path().join("kept");
        if dir.file_name().to_string_lossy().starts_with("emx-docker.")
            && std::fs::read_to_string(&kept).is_ok_and(|k| k.trim() == "emx-test")
        {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
    let (ok, text) = run_script("docker/testbed.sh", "2", &[("EMX_KEEP", "emx-test")]);
    let project = project_of(&text);
    let remove = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("testbed:   remove: "))
        .map(str::to_string);
    let running = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=com.docker.compose.project={project}"),
        "--filter",
        "status=running",
    ])
    .1;
    let removed = remove.as_deref().map(|cmd| {
        Command::new("bash")
            .args(["-c", cmd])
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(ok, "{text}");
    assert!(text.contains("cluster check passed"), "{text}");
    assert_eq!(
        running.lines().count(),
        2,
        "kept containers not running: {text}"
    );
    let remove = remove.unwrap_or_else(|| panic!("no remove command: {text}"));
    let work = remove
        .rsplit(' ')
        .next()
        .expect("the work directory")
        .to_string();
    assert_eq!(removed, Some(true), "{remove}");
    assert!(!Path::new(&work).exists(), "{work} left");
    assert_eq!(
        left_of(&project),
        "",
        "{project} left containers or networks"
    );
}

/// Runs docker with `args`: whether it succeeded, and its stdout.
fn docker(args: &[&str]) -> (bool, String) {
    match Command::new("docker").args(args).output() {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into(),
        ),
        Err(_) => (false, String::new()),
    }
}

/// Removes the containers, then the networks, that carry `label`.
fn remove_labelled(label: &str) {
    let filter = format!("label={label}");
    for id in docker(&["ps", "-a", "-q", "--filter", &filter]).1.lines() {
        docker(&["rm", "-f", id]);
    }
    for id in docker(&["network", "ls", "-q", "--filter", &filter])
        .1
        .lines()
    {
        docker(&["network", "rm", id]);
    }
}

/// What docker/testbed.sh labels its things' owner with: this user, in
/// this pid namespace.
fn owner() -> String {
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    format!("{}:{ns}", nix::unistd::getuid())
}

/// The compose project a testbed run named (`testbed: project emxtbN: ...`).
fn project_of(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("testbed: project "))
        .and_then(|l| l.split(':').next())
        .unwrap_or_else(|| panic!("no project line: {text}"))
        .to_string()
}

/// The containers and networks of compose project `project` still there.
fn left_of(project: &str) -> String {
    let label = format!("label=com.docker.compose.project={project}");
    let containers = docker(&["ps", "-a", "-q", "--filter", &label]).1;
    let networks = docker(&["network", "ls", "-q", "--filter", &label]).1;
    format!("{containers}{networks}").trim().to_string()
}

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

fn run_script(script: &str, extra_env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new("bash")
        .arg(root().join(script))
        .arg("3")
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
    let (ok, text) = run_script("scripts/testbed-netns.sh", &[]);
    assert!(ok, "{text}");
    assert!(text.contains("cluster check passed"), "{text}");
}

#[test]
fn docker_testbed_3_nodes() {
    let docker = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    match docker {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!(
                "SKIPPED docker_testbed_3_nodes: no Docker engine answers `docker info` here"
            );
            return;
        }
    }
    let compose = |args: &[&str]| {
        Command::new(args[0])
            .args(&args[1..])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !compose(&["docker", "compose", "version"]) && !compose(&["docker-compose", "version"]) {
        eprintln!(
            "SKIPPED docker_testbed_3_nodes: Docker answers, but without Compose (install the \
             docker compose plugin or docker-compose)"
        );
        return;
    }
    let (ok, text) = run_script("docker/testbed.sh", &[]);
    assert!(ok, "{text}");
    assert!(text.contains("cluster check passed"), "{text}");
}

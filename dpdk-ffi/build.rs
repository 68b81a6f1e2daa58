//! Finds the system DPDK with pkg-config, generates bindings for the symbols emx
//! uses (an explicit allowlist keeps them small and their diffs readable), and
//! compiles the C shim that exports DPDK's `static inline` fast-path functions.

use std::env;
use std::path::PathBuf;
use std::process::exit;

/// The oldest DPDK emx is written against (Debian bookworm's LTS).
const MIN_DPDK: &str = "22.11";

/// DPDK libraries emx calls into. The EAL loads the poll-mode drivers itself
/// (from its PMD directory) when DPDK is linked shared, so none are named here.
const SHARED_LIBS: &[&str] = &[
    "rte_ethdev",
    "rte_net",
    "rte_meter",
    "rte_mbuf",
    "rte_mempool",
    "rte_ring",
    "rte_rcu",
    "rte_eal",
    "rte_kvargs",
    "rte_telemetry",
];

/// Drivers linked into a static build, so that a binary can travel to a
/// machine with no DPDK installed (only `libnuma.so.1` and glibc's own
/// libraries stay dynamic).
const STATIC_WHOLE: &[&str] = &[
    "rte_net_memif",
    "rte_net_ring",
    "rte_net_af_packet",
    "rte_net_tap",
    "rte_bus_vdev",
    "rte_mempool_ring",
];
const STATIC_LIBS: &[&str] = &[
    "rte_gso",
    "rte_ethdev",
    "rte_net",
    "rte_meter",
    "rte_mbuf",
    "rte_mempool",
    "rte_ring",
    "rte_hash",
    "rte_rcu",
    "rte_eal",
    "rte_kvargs",
    "rte_telemetry",
];

fn main() {
    println!("cargo:rerun-if-changed=shim/emx_shim.h");
    println!("cargo:rerun-if-changed=shim/emx_shim.c");
    println!("cargo:rerun-if-env-changed=EMX_DPDK_STATIC");
    // Drivers are linked in (a static build) or loaded from the PMD
    // directory (see `driver_missing` in src/port.rs).
    println!("cargo::rustc-check-cfg=cfg(emx_dpdk_static)");
    if env::var_os("EMX_DPDK_STATIC").is_some() {
        println!("cargo:rustc-cfg=emx_dpdk_static");
    }
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let dpdk = match pkg_config::Config::new()
        .atleast_version(MIN_DPDK)
        .cargo_metadata(false)
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(e) => {
            let why = e.to_string();
            let why = why.lines().next().unwrap_or_default();
            eprintln!(
                "error: DPDK >= {MIN_DPDK} not found by pkg-config ({why}); install the Debian/Ubuntu \
                 package libdpdk-dev, or run `sudo bash scripts/setup.sh` from the repository root"
            );
            exit(1);
        }
    };

    // pkg-config's cflags carry `-include rte_config.h` and `-march=...`; both
    // clang (bindgen) and cc need all of them, or struct layouts disagree.
    let cflags = pkg_config_cflags();

    let mut shim = cc::Build::new();
    shim.file("shim/emx_shim.c")
        .define("ALLOW_EXPERIMENTAL_API", None)
        // fopencookie(3), before `-include rte_config.h` pulls in libc headers
        .define("_GNU_SOURCE", None)
        .opt_level(3)
        .warnings(false)
        // DPDK's headers warn; a function used undeclared must not pass.
        .flag("-Werror=implicit-function-declaration");
    for f in &cflags {
        shim.flag(f);
    }
    shim.compile("emx_dpdk_shim");

    link(&dpdk);

    let mut clang_args: Vec<String> = cflags.clone();
    clang_args.push("-DALLOW_EXPERIMENTAL_API".into());
    let bindings = bindgen::Builder::default()
        .header("shim/emx_shim.h")
        .clang_args(clang_args)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .use_core()
        .layout_tests(true)
        .derive_default(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        // EAL and lcores
        .allowlist_function("rte_eal_init")
        .allowlist_function("rte_eal_cleanup")
        .allowlist_function("rte_eal_iova_mode")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_thread_register")
        .allowlist_function("rte_thread_unregister")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_get_tsc_hz")
        .allowlist_function("rte_log_set_global_level")
        // devices and ports
        .allowlist_function("rte_dev_probe")
        .allowlist_function("rte_dev_remove")
        .allowlist_function("rte_eth_dev_get_port_by_name")
        .allowlist_function("rte_eth_dev_get_name_by_port")
        .allowlist_function("rte_eth_dev_is_valid_port")
        .allowlist_function("rte_eth_dev_count_avail")
        .allowlist_function("rte_eth_dev_info_get")
        .allowlist_function("rte_eth_dev_configure")
        .allowlist_function("rte_eth_dev_adjust_nb_rx_tx_desc")
        .allowlist_function("rte_eth_rx_queue_setup")
        .allowlist_function("rte_eth_tx_queue_setup")
        .allowlist_function("rte_eth_dev_socket_id")
        .allowlist_function("rte_eth_dev_start")
        .allowlist_function("rte_eth_dev_stop")
        .allowlist_function("rte_eth_dev_close")
        .allowlist_function("rte_eth_dev_set_mtu")
        .allowlist_function("rte_eth_dev_get_mtu")
        .allowlist_function("rte_eth_macaddr_get")
        .allowlist_function("rte_eth_promiscuous_enable")
        .allowlist_function("rte_eth_link_get_nowait")
        .allowlist_function("rte_eth_stats_get")
        .allowlist_function("rte_eth_stats_reset")
        .allowlist_function("rte_eth_dev_get_dev_by_name")
        // memory
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_mempool_free")
        .allowlist_function("rte_mempool_avail_count")
        .allowlist_function("rte_mempool_in_use_count")
        .allowlist_function("rte_mempool_lookup")
        .allowlist_function("rte_extmem_register")
        .allowlist_function("rte_extmem_unregister")
        .allowlist_function("rte_dev_dma_map")
        .allowlist_function("rte_dev_dma_unmap")
        .allowlist_function("rte_mem_virt2phy")
        // the shim: inline functions and per-thread values
        .allowlist_function(".*_")
        .allowlist_function("emx_.*")
        .allowlist_type("rte_mbuf")
        .allowlist_type("rte_mbuf_ext_shared_info")
        .allowlist_type("rte_eth_.*")
        .allowlist_var("RTE_ETH_.*")
        .allowlist_var("RTE_MBUF_.*")
        .allowlist_var("RTE_PKTMBUF_HEADROOM")
        .allowlist_var("RTE_MEMPOOL_CACHE_MAX_SIZE")
        .allowlist_var("RTE_MAX_ETHPORTS")
        .allowlist_var("RTE_ETHER_.*")
        .allowlist_var("SOCKET_ID_ANY")
        .allowlist_var("RTE_BAD_IOVA")
        .allowlist_type("rte_iova_mode")
        // rte_flow's protocol headers are pulled in by rte_ethdev.h; this packed
        // struct holding an aligned one cannot be laid out by bindgen
        // (rust-lang/rust-bindgen#1538), and emx does not use it.
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_arp_hdr")
        .opaque_type("rte_arp_ipv4")
        .generate()
        .unwrap_or_else(|e| {
            eprintln!("error: bindgen could not generate DPDK bindings: {e}");
            exit(1);
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}

/// The cflags exactly as pkg-config prints them (the crate splits `-include`
/// from its argument in ways clang then misreads).
fn pkg_config_cflags() -> Vec<String> {
    let out = std::process::Command::new(env::var("PKG_CONFIG").unwrap_or("pkg-config".into()))
        .args(["--cflags", "libdpdk"])
        .output()
        .expect("pkg-config ran a moment ago");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn link(dpdk: &pkg_config::Library) {
    for p in &dpdk.link_paths {
        println!("cargo:rustc-link-search=native={}", p.display());
    }
    if env::var_os("EMX_DPDK_STATIC").is_some() {
        for l in STATIC_WHOLE {
            println!("cargo:rustc-link-lib=static:+whole-archive,-bundle={l}");
        }
        for l in STATIC_LIBS {
            println!("cargo:rustc-link-lib=static:-bundle={l}");
        }
        for l in ["bsd", "md"] {
            println!("cargo:rustc-link-lib=static:-bundle={l}");
        }
        for l in ["numa", "pthread", "dl", "m"] {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    } else {
        for l in SHARED_LIBS {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }
}

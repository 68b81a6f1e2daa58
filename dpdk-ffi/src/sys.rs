//! Raw bindings: bindgen output for the allowlisted DPDK symbols, and the C
//! shim's exports of inline functions re-exported under DPDK's own names.
//!
//! Everything here is `unsafe` to call; the safe types of this crate are built
//! on it, and the benchmark uses it directly as the raw-DPDK baseline.
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

pub use self::rte_errno_ as rte_errno;
pub use self::rte_eth_rx_burst_ as rte_eth_rx_burst;
pub use self::rte_eth_tx_burst_ as rte_eth_tx_burst;
pub use self::rte_eth_tx_done_cleanup_ as rte_eth_tx_done_cleanup;
pub use self::rte_lcore_id_ as rte_lcore_id;
pub use self::rte_mbuf_ext_refcnt_update_ as rte_mbuf_ext_refcnt_update;
pub use self::rte_mbuf_has_extbuf_ as rte_mbuf_has_extbuf;
pub use self::rte_mbuf_refcnt_read_ as rte_mbuf_refcnt_read;
pub use self::rte_pktmbuf_adj_ as rte_pktmbuf_adj;
pub use self::rte_pktmbuf_alloc_ as rte_pktmbuf_alloc;
pub use self::rte_pktmbuf_alloc_bulk_ as rte_pktmbuf_alloc_bulk;
pub use self::rte_pktmbuf_append_ as rte_pktmbuf_append;
pub use self::rte_pktmbuf_attach_extbuf_ as rte_pktmbuf_attach_extbuf;
pub use self::rte_pktmbuf_chain_ as rte_pktmbuf_chain;
pub use self::rte_pktmbuf_data_room_size_ as rte_pktmbuf_data_room_size;
pub use self::rte_pktmbuf_free_ as rte_pktmbuf_free;
pub use self::rte_pktmbuf_free_bulk_ as rte_pktmbuf_free_bulk;
pub use self::rte_pktmbuf_headroom_ as rte_pktmbuf_headroom;
pub use self::rte_pktmbuf_prepend_ as rte_pktmbuf_prepend;
pub use self::rte_pktmbuf_tailroom_ as rte_pktmbuf_tailroom;
pub use self::rte_pktmbuf_trim_ as rte_pktmbuf_trim;
pub use self::rte_rdtsc_ as rte_rdtsc;

// Offload flags are `RTE_BIT64(n)` macros, which bindgen cannot evaluate.
/// `RTE_ETH_RX_OFFLOAD_SCATTER`.
pub const RTE_ETH_RX_OFFLOAD_SCATTER: u64 = 1 << 13;
/// `RTE_ETH_TX_OFFLOAD_MULTI_SEGS`.
pub const RTE_ETH_TX_OFFLOAD_MULTI_SEGS: u64 = 1 << 15;

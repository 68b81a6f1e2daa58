//! Ethernet ports: configuration, start, link, statistics, and the rx/tx
//! queues, each handed to one owner at a time so that one queue belongs to one
//! thread (dropping the handle gives it back).

use std::ffi::{c_char, CStr, CString};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::eal::Eal;
use crate::error::{Errno, Error, Result, ToResult};
use crate::mbuf::{Burst, Mbuf};
use crate::mempool::Mempool;
use crate::sys;

/// How to set a port up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// Receive queues.
    pub rx_queues: u16,
    /// Transmit queues.
    pub tx_queues: u16,
    /// Descriptors per receive queue (the driver may round it).
    pub rx_desc: u16,
    /// Descriptors per transmit queue (the driver may round it).
    pub tx_desc: u16,
    /// MTU in bytes, or the driver's default. It must fit the driver's
    /// frame limit (memif: up to [`MEMIF_MAX_MTU`]); frames longer than the
    /// pool's data room arrive chained where the driver can scatter.
    pub mtu: Option<u16>,
    /// Receive frames for any destination MAC.
    pub promiscuous: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            mtu: None,
            promiscuous: false,
        }
    }
}

/// Link state as the driver reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStatus {
    /// Link up.
    pub up: bool,
    /// Speed in Mbit/s (0 when unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Basic port counters (`rte_eth_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames dropped because the receive queues were full.
    pub rx_missed: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Receive failures for want of an mbuf.
    pub rx_no_mbuf: u64,
}

/// A configured and started Ethernet port. Clones share it; when the last
/// clone and every queue taken from it are gone it is stopped, closed and, if
/// [`Port::from_devargs`] created the device, removed, in that order, before
/// its mempool and the EAL are released.
#[derive(Clone)]
pub struct Port(Arc<PortInner>);

struct PortInner {
    id: u16,
    name: String,
    mac: [u8; 6],
    mtu: u16,
    multi_seg_tx: bool,
    rx_taken: Vec<AtomicBool>,
    tx_taken: Vec<AtomicBool>,
    /// The device, when this handle probed it and must remove it.
    hotplugged: Option<*mut sys::rte_device>,
    /// The port is this handle's (released once the port is closed, still in
    /// the control path: the id may go to the next device probed).
    claim: Option<Claim>,
    /// The most mbufs of the pool the driver may keep after the port is
    /// closed (0 but for AF_XDP: its fill ring's, and what its transmit
    /// rings held).
    driver_keeps: u32,
    // Dropped after the port is closed: the rx queues hold its mbufs until then.
    _pool: Mempool,
    _eal: Eal,
}

// SAFETY: setup, teardown (configure, start, stop, close, remove), the
// statistics and the link status, which DPDK does not make thread-safe (a
// driver's link_update writes shared state), run under the crate's control
// lock (`crate::control`); the other queries made through a shared PortInner
// (name, MAC) only read; the device pointer is only used in Drop.
unsafe impl Send for PortInner {}
// SAFETY: as above; queues, which are not thread-safe, are separate owned types.
unsafe impl Sync for PortInner {}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("id", &self.0.id)
            .field("name", &self.0.name)
            .field("mac", &format_mac(&self.0.mac))
            .field("mtu", &self.0.mtu)
            .finish()
    }
}

impl Port {
    /// Creates a device from devargs (`net_memif0,role=server,socket=/tmp/m.sock`,
    /// a PCI address, ...) and sets it up as [`Port::open`] does. A device that
    /// already exists (for example from `--vdev`) is opened, not created again.
    ///
    /// A memif device asked for an MTU whose frames outgrow memif's ring
    /// buffers (`bsize`, 2048 bytes by default) gets a `bsize` that holds a
    /// whole frame, and rings with fewer slots; see [`MEMIF_MAX_MTU`].
    pub fn from_devargs(
        eal: &Eal,
        devargs: &str,
        cfg: &PortConfig,
        pool: &Mempool,
    ) -> Result<Port> {
        let control = crate::control::control();
        let name = devargs.split(',').next().unwrap_or_default().trim();
        // DPDK names a NIC's port by its full address in lower case, however
        // the devargs wrote it: the lookups below use that name.
        let canonical = crate::pci_canonical(name);
        let name = canonical.as_deref().unwrap_or(name);
        if let Some(why) = not_a_device(name).or_else(|| no_such_pci_device(name)) {
            return Err(Error::Config(why));
        }
        if is_memif(name) {
            memif_keys(name, devargs)?;
        }
        let sized;
        let devargs = match memif_sizing(name, devargs, cfg.mtu)? {
            Some(extra) => {
                sized = format!("{devargs}{extra}");
                sized.as_str()
            }
            None => devargs,
        };
        let cdev = CString::new(devargs).map_err(|_| Error::Devargs {
            devargs: devargs.into(),
            errno: Some(Errno(libc::EINVAL)),
        })?;
        // A device that exists already is not probed again: DPDK 22.11's memif
        // answers a second probe of a live interface by breaking its control
        // channel (the interrupt thread then panicked on a closed fd).
        let existing = port_by_name(name);
        let ret = match existing {
            Some(_) => -libc::EEXIST,
            None => {
                // A memif probe adds to its socket's interface list, which
                // memif's handlers on the interrupt thread walk. (Devices
                // that `rte_eal_init` probes, from `--vdev`, are not held:
                // no Port exists yet, and the thread has nothing to handle
                // unless a peer in another process is already connecting.)
                let _held = is_memif(name).then(|| crate::control::hold_interrupts(&control));
                // SAFETY: a valid NUL-terminated string; the EAL is running.
                unsafe { sys::rte_dev_probe(cdev.as_ptr()) }
            }
        };
        let created = match ret {
            0 => true,
            r if r == -libc::EEXIST => false,
            r => {
                // Drivers often fail with a bare -1, which is no errno.
                let errno = (r != -1).then(|| Errno::from_ret(r));
                return Err(if driver_missing(name) {
                    Error::NoDriver {
                        devargs: devargs.into(),
                        driver: driver_name(name).into(),
                    }
                } else if crate::is_pci_address(name) {
                    // The device is there (checked above): the usual cause is
                    // the kernel's driver holding it.
                    Error::Config(format!(
                        "`{devargs}`: the probe failed{}: a NIC must be bound to vfio-pci (or \
                         another driver DPDK can use) first: `dpdk-devbind.py --bind=vfio-pci \
                         {name}` (`dpdk-devbind.py --status` lists them)",
                        errno.map(|e| format!(" with {e}")).unwrap_or_default()
                    ))
                } else if needs_root(name) && !is_root() {
                    Error::Config(format!(
                        "`{devargs}`: the {} driver could not open its interface, and this \
                         process is not root: it needs CAP_NET_RAW and CAP_NET_ADMIN (run it \
                         as root)",
                        driver_name(name)
                    ))
                } else {
                    Error::Devargs {
                        devargs: devargs.into(),
                        errno,
                    }
                });
            }
        };
        let opened = port_by_name(name)
            .ok_or_else(|| Error::Devargs {
                devargs: devargs.into(),
                errno: Some(Errno(libc::ENODEV)),
            })
            .and_then(|id| Self::setup(eal, id, cfg, pool, created));
        if opened.is_err() && created {
            // A refusal before the handle took the port (queue counts, MTU)
            // leaves the device this call probed: it goes, as it would with
            // the handle, so that the devargs can be tried again.
            remove_unopened(name);
        }
        opened.map_err(|e| match e {
            // A memif client's start (client is memif's default role)
            // connects to its server's socket, and fails with no error code
            // when nobody listens there.
            Error::Call {
                call: "rte_eth_dev_start",
                ..
            } if is_memif(name) && devarg(devargs, "role") != Some("server") => {
                Error::Config(format!(
                    "memif client `{name}` could not connect to its server ({devargs}): start \
                     the role=server side first, or check socket= and socket-abstract= (a \
                     server's socket is a file only with socket-abstract=no)"
                ))
            }
            e => e,
        })
    }

    /// Sets up an existing port: configures its queues and MTU, binds its
    /// receive queues to `pool`, and starts it.
    pub fn open(eal: &Eal, id: u16, cfg: &PortConfig, pool: &Mempool) -> Result<Port> {
        let _control = crate::control::control();
        Self::setup(eal, id, cfg, pool, false)
    }

    fn setup(eal: &Eal, id: u16, cfg: &PortConfig, pool: &Mempool, created: bool) -> Result<Port> {
        // SAFETY: plain queries with a port id; no pointers.
        if unsafe { sys::rte_eth_dev_is_valid_port(id) } == 0 {
            let available = unsafe { sys::rte_eth_dev_count_avail() };
            return Err(Error::UnknownPort {
                port: id,
                available,
            });
        }
        // Before anything touches the port: one that another handle has open
        // is left alone (the failure paths below stop and close the port).
        let claim = Claim::take(id)?;
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: valid port id; info is a writable rte_eth_dev_info.
        unsafe { sys::rte_eth_dev_info_get(id, &mut info) }.check("rte_eth_dev_info_get")?;
        // Checked before the handle takes the port (queue counts, MTU, buffer
        // room): a refusal leaves a port this handle did not create untouched
        // (a closed port is gone for the process), so it opens again with a
        // configuration that fits.
        if cfg.rx_queues == 0
            || cfg.rx_queues > info.max_rx_queues
            || cfg.tx_queues == 0
            || cfg.tx_queues > info.max_tx_queues
        {
            return Err(Error::Config(format!(
                "port {id} ({}) supports 1..={} rx and 1..={} tx queues; asked for {} and {}",
                port_name(id),
                info.max_rx_queues,
                info.max_tx_queues,
                cfg.rx_queues,
                cfg.tx_queues
            )));
        }
        let mut conf = sys::rte_eth_conf::default();
        let chains = chains_long_frames(&info);
        // An MTU beyond what the driver claims, on a driver that chains: the
        // ethdev is configured within its claim and the port keeps the MTU.
        let mut beyond_claim = None;
        if let Some(mtu) = cfg.mtu {
            if u32::from(mtu) > u32::from(info.max_mtu) || u32::from(mtu) < u32::from(info.min_mtu)
            {
                return Err(Error::Config(format!(
                    "port {id} ({}) accepts an MTU of {} to {}; asked for {mtu}",
                    port_name(id),
                    info.min_mtu,
                    info.max_mtu
                )));
            }
            // Some drivers claim a larger max_mtu than the frames they take;
            // the frame size decides.
            let frame = u32::from(mtu) + ETHER_OVERHEAD;
            let max_frame = if chains {
                info.max_rx_pktlen
                    .max(u32::from(MEMIF_MAX_MTU) + ETHER_OVERHEAD)
            } else {
                info.max_rx_pktlen
            };
            if frame > max_frame {
                return Err(Error::MtuTooLarge {
                    port: format!("{id} ({})", port_name(id)),
                    max_frame,
                    max_mtu: max_frame.saturating_sub(ETHER_OVERHEAD),
                    asked: mtu,
                });
            }
            let room = u32::from(pool.data_room()) - sys::RTE_PKTMBUF_HEADROOM;
            let scatter = info.rx_offload_capa & sys::RTE_ETH_RX_OFFLOAD_SCATTER != 0;
            if frame > room && !scatter && !chains {
                return Err(Error::Config(format!(
                    "MTU {mtu} needs {frame}-byte buffers but mempool `{}` has {room} and port {id} \
                     cannot scatter; create the pool with a data room of at least {}",
                    pool.name(),
                    frame + sys::RTE_PKTMBUF_HEADROOM
                )));
            }
            if frame > room && scatter {
                conf.rxmode.offloads |= sys::RTE_ETH_RX_OFFLOAD_SCATTER;
            }
            if frame > info.max_rx_pktlen {
                // Only a chaining driver gets here; it enforces no frame length.
                beyond_claim = Some(mtu);
                conf.rxmode.mtu = info.max_rx_pktlen.saturating_sub(ETHER_OVERHEAD);
            } else {
                conf.rxmode.mtu = u32::from(mtu);
            }
        }
        // Remove the device on drop only if this handle created it. Built here,
        // so that a failure below still stops, closes and removes it.
        // Before the queues are set up: see `driver_keeps`.
        let in_use_before = pool.in_use();
        let mut inner = PortInner {
            claim: Some(claim),
            id,
            name: port_name(id),
            mac: [0; 6],
            mtu: 0,
            multi_seg_tx: info.tx_offload_capa & sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS != 0,
            rx_taken: (0..cfg.rx_queues).map(|_| AtomicBool::new(false)).collect(),
            tx_taken: (0..cfg.tx_queues).map(|_| AtomicBool::new(false)).collect(),
            hotplugged: created.then_some(info.device),
            driver_keeps: 0,
            _pool: pool.clone(),
            _eal: eal.clone(),
        };
        if inner.multi_seg_tx {
            conf.txmode.offloads |= sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
        }
        // SAFETY: valid port id and configuration; the port is stopped.
        unsafe { sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf) }
            .check("rte_eth_dev_configure")?;
        let (mut nrx, mut ntx) = (cfg.rx_desc, cfg.tx_desc);
        // SAFETY: valid port id; both pointers are to locals.
        unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nrx, &mut ntx) }
            .check("rte_eth_dev_adjust_nb_rx_tx_desc")?;
        // SAFETY: a plain query.
        let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
        // A device with no NUMA node (a vdev, say) gets memory from any.
        let socket = if socket < 0 {
            sys::SOCKET_ID_ANY as u32
        } else {
            socket as u32
        };
        for q in 0..cfg.rx_queues {
            // SAFETY: configured port, queue in range, pool alive (the port keeps
            // a clone of it); a null conf means the driver's defaults.
            unsafe {
                sys::rte_eth_rx_queue_setup(id, q, nrx, socket, std::ptr::null(), pool.as_ptr())
            }
            .check("rte_eth_rx_queue_setup")?;
        }
        for q in 0..cfg.tx_queues {
            // SAFETY: configured port, queue in range; null conf: defaults.
            unsafe { sys::rte_eth_tx_queue_setup(id, q, ntx, socket, std::ptr::null()) }
                .check("rte_eth_tx_queue_setup")?;
        }
        if cfg.promiscuous {
            // Not every driver has it (memif does not need it); a refusal is fine.
            // SAFETY: valid port id.
            let _ = unsafe { sys::rte_eth_promiscuous_enable(id) };
        }
        // Not under a hold of the interrupt thread (see `hold_interrupts`),
        // on purpose: memif's handlers reach a port only once it has started
        // (a server's is disabled until then, a client has no control channel
        // yet), and a memif client's start connects to its server's socket,
        // whose connections that thread accepts: with two or more waiting,
        // connect() blocks until it does.
        // SAFETY: configured port with all queues set up.
        unsafe { sys::rte_eth_dev_start(id) }.check("rte_eth_dev_start")?;
        if keeps_fill_ring(&info) {
            // DPDK 22.11's af_xdp gives back neither the mbufs of its fill
            // ring, taken at queue setup and start (counted on the whole
            // pool: another port's traffic meanwhile counts too, so this
            // bounds it from above), nor those its transmit rings still hold
            // when the port closes.
            let fill = pool.in_use().saturating_sub(in_use_before);
            inner.driver_keeps = fill + u32::from(ntx) * u32::from(cfg.tx_queues);
        }
        let mut mac = sys::rte_ether_addr::default();
        // SAFETY: valid port; mac is writable.
        unsafe { sys::rte_eth_macaddr_get(id, &mut mac) }.check("rte_eth_macaddr_get")?;
        inner.mac = mac.addr_bytes;
        let mut mtu = 0u16;
        // SAFETY: valid port; mtu is writable.
        unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) }.check("rte_eth_dev_get_mtu")?;
        inner.mtu = beyond_claim.unwrap_or(mtu);
        Ok(Port(Arc::new(inner)))
    }

    /// DPDK's port id, for the raw bindings.
    pub fn id(&self) -> u16 {
        self.0.id
    }

    /// The port's device, for calls on the device rather than the port.
    pub(crate) fn device(&self) -> Result<*mut sys::rte_device> {
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: a valid port id (this handle keeps the port); info is a
        // writable rte_eth_dev_info.
        unsafe { sys::rte_eth_dev_info_get(self.0.id, &mut info) }.check("rte_eth_dev_info_get")?;
        Ok(info.device)
    }

    /// The device name (`net_memif0`, `0000:03:00.0`, ...).
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The port's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.0.mac
    }

    /// The MTU in force: the driver's, or the one asked for on a memif port
    /// whose driver claims less than it carries (see [`MEMIF_MAX_MTU`]).
    pub fn mtu(&self) -> u16 {
        self.0.mtu
    }

    /// Whether the port transmits chained (multi-segment) mbufs, which
    /// zero-copy sends from [`ExtBuf`](crate::ExtBuf) need.
    pub fn multi_seg_tx(&self) -> bool {
        self.0.multi_seg_tx
    }

    /// The link state now.
    pub fn link(&self) -> LinkStatus {
        link_status(self.0.id)
    }

    /// Waits until the link is up, or fails after `timeout`.
    pub fn wait_link(&self, timeout: Duration) -> Result<LinkStatus> {
        self.wait_link_unless(timeout, &|| false)
            .map(|l| l.expect("never stopped"))
    }

    /// [`wait_link`](Self::wait_link) that gives up, with `Ok(None)`, as
    /// soon as `stop` says so (it is asked every 5 ms).
    pub fn wait_link_unless(
        &self,
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<LinkStatus>> {
        let start = Instant::now();
        loop {
            let l = self.link();
            if l.up {
                return Ok(Some(l));
            }
            if start.elapsed() >= timeout {
                return Err(Error::LinkTimeout {
                    port: self.0.id,
                    timeout,
                });
            }
            if stop() {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The port's counters.
    pub fn stats(&self) -> Result<PortStats> {
        // (Some drivers total their counters up in shared state as they go.)
        let _control = crate::control::control();
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port; s is writable.
        unsafe { sys::rte_eth_stats_get(self.0.id, &mut s) }.check("rte_eth_stats_get")?;
        Ok(PortStats {
            rx_packets: s.ipackets,
            tx_packets: s.opackets,
            rx_bytes: s.ibytes,
            tx_bytes: s.obytes,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
            rx_no_mbuf: s.rx_nombuf,
        })
    }

    /// Hands out receive queue `queue` to one owner at a time: refused while
    /// another handle to it lives; dropping the handle gives it back.
    pub fn rx_queue(&self, queue: u16) -> Result<RxQueue> {
        take(&self.0.rx_taken, self.0.id, queue)?;
        Ok(RxQueue {
            port: self.0.clone(),
            port_id: self.0.id,
            queue,
            _not_sync: PhantomData,
        })
    }

    /// Hands out transmit queue `queue` to one owner at a time: refused while
    /// another handle to it lives; dropping the handle gives it back.
    pub fn tx_queue(&self, queue: u16) -> Result<TxQueue> {
        take(&self.0.tx_taken, self.0.id, queue)?;
        Ok(TxQueue {
            port: self.0.clone(),
            port_id: self.0.id,
            queue,
            _not_sync: PhantomData,
        })
    }
}

impl Drop for RxQueue {
    /// Gives the queue back to its port, for another owner to take.
    fn drop(&mut self) {
        self.port.rx_taken[usize::from(self.queue)].store(false, Ordering::Release);
    }
}

impl Drop for TxQueue {
    /// Gives the queue back to its port, for another owner to take.
    fn drop(&mut self) {
        self.port.tx_taken[usize::from(self.queue)].store(false, Ordering::Release);
    }
}

fn take(flags: &[AtomicBool], port: u16, queue: u16) -> Result<()> {
    let flag = flags.get(usize::from(queue)).ok_or(Error::Queue {
        port,
        queue,
        why: "no such queue",
    })?;
    if flag.swap(true, Ordering::AcqRel) {
        return Err(Error::Queue {
            port,
            queue,
            why: "already taken by another owner",
        });
    }
    Ok(())
}

/// Port ids that a live [`Port`] owns in this process.
static CLAIMED: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A port id owned by one [`Port`] (and its clones) until dropped. A second
/// handle set up on the same port would reconfigure it under the first, and
/// its failure path or its drop would stop and close it while the first one's
/// queues are polled.
struct Claim(u16);

impl Claim {
    fn take(id: u16) -> Result<Claim> {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
        if !claimed.insert(id) {
            return Err(Error::Config(format!(
                "port {id} ({}) is already open in this process: use (or clone) the Port \
                 that has it, or drop that one first",
                port_name(id)
            )));
        }
        Ok(Claim(id))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        CLAIMED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

impl Drop for PortInner {
    fn drop(&mut self) {
        let control = crate::control::control();
        // memif's stop, close and remove free what its handlers on the
        // interrupt thread use (the peer's disconnect may be in progress).
        // One hold covers all three: memif's stop leaves a server port open
        // to a peer's init, which a handler run between stop and close would
        // give a control channel that the close then frees.
        let _held = is_memif(&self.name).then(|| crate::control::hold_interrupts(&control));
        // SAFETY: no queue handle is left (each holds an Arc of this), so no
        // thread is in rx/tx burst; stop before close, close before remove.
        let (stop, close) = unsafe {
            (
                sys::rte_eth_dev_stop(self.id),
                sys::rte_eth_dev_close(self.id),
            )
        };
        // A refusal leaves the device running (DPDK 22.11 closes no started
        // port): say so, since its driver may still write into the pool.
        for (call, ret) in [("stop", stop), ("close", close)] {
            if ret < 0 {
                eprintln!(
                    "dpdk-ffi: port {} ({}): rte_eth_dev_{call} failed with {}; the device \
                     is left as it is",
                    self.id,
                    self.name,
                    Errno::from_ret(ret)
                );
            }
        }
        if let Some(dev) = self.hotplugged.filter(|_| close == 0) {
            // SAFETY: the port this handle probed is closed; its device goes.
            unsafe { sys::rte_dev_remove(dev) };
        }
        if self.driver_keeps > 0 {
            self._pool.kept_by_driver(self.driver_keeps);
        }
        drop(self.claim.take());
    }
}

/// A receive queue of a [`Port`]: `Send` but not `Sync`, so exactly one thread
/// polls it at a time.
pub struct RxQueue {
    port: Arc<PortInner>,
    port_id: u16,
    queue: u16,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl RxQueue {
    /// Receives up to the burst's free room; returns how many arrived.
    #[inline]
    pub fn rx_burst<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let (ptr, room) = burst.spare();
        // SAFETY: this queue is owned by self alone; ptr has `room` free slots,
        // and the driver writes at most that many owned mbufs into them.
        let n = unsafe { sys::rte_eth_rx_burst(self.port_id, self.queue, ptr, room as u16) };
        // SAFETY: the driver filled n slots with mbufs it handed over.
        unsafe { burst.filled(usize::from(n)) };
        usize::from(n)
    }

    /// Receives up to `max` frames, appended to `out` without growing it past
    /// its capacity (reserve once, and the fast path never allocates).
    #[inline]
    pub fn rx_into(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let room = (out.capacity() - out.len())
            .min(max)
            .min(usize::from(u16::MAX));
        let spare = out.spare_capacity_mut();
        // SAFETY: Mbuf is repr(transparent) over the mbuf pointer, so the spare
        // capacity is an array of `room` writable pointer slots; this queue is
        // owned by self alone.
        let n = unsafe {
            sys::rte_eth_rx_burst(
                self.port_id,
                self.queue,
                spare.as_mut_ptr() as *mut *mut sys::rte_mbuf,
                room as u16,
            )
        };
        // SAFETY: the driver initialised n slots with mbufs it handed over.
        unsafe { out.set_len(out.len() + usize::from(n)) };
        usize::from(n)
    }

    /// The port this queue belongs to.
    pub fn port_id(&self) -> u16 {
        self.port.id
    }

    /// The queue's index.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

/// A transmit queue of a [`Port`]: `Send` but not `Sync`.
pub struct TxQueue {
    port: Arc<PortInner>,
    port_id: u16,
    queue: u16,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl TxQueue {
    /// Transmits from the front of the burst; the frames the driver took are
    /// removed, those it refused stay (at the front) for a later try.
    #[inline]
    pub fn tx_burst<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let (ptr, len) = burst.raw();
        // SAFETY: this queue is owned by self alone; ptr holds len owned mbufs.
        let n = unsafe { sys::rte_eth_tx_burst(self.port_id, self.queue, ptr, len as u16) };
        // SAFETY: the driver now owns the first n mbufs.
        unsafe { burst.consumed(usize::from(n)) };
        usize::from(n)
    }

    /// Transmits from the front of `frames`; those the driver took are removed,
    /// the rest move to the front for a later try.
    #[inline]
    pub fn tx_from(&mut self, frames: &mut Vec<Mbuf>) -> usize {
        let len = frames.len().min(usize::from(u16::MAX));
        // SAFETY: Mbuf is repr(transparent) over the pointer; frames holds len
        // owned mbufs; this queue is owned by self alone.
        let n = usize::from(unsafe {
            sys::rte_eth_tx_burst(
                self.port_id,
                self.queue,
                frames.as_mut_ptr() as *mut *mut sys::rte_mbuf,
                len as u16,
            )
        });
        // SAFETY: the driver owns the first n now: forget them (set_len before
        // moving, so a panic cannot double-free), then close the gap.
        unsafe {
            let rest = frames.len() - n;
            let p = frames.as_mut_ptr();
            frames.set_len(0);
            std::ptr::copy(p.add(n), p, rest);
            frames.set_len(rest);
        }
        n
    }

    /// Transmits one frame, or hands it back when the queue is full.
    #[inline]
    pub fn tx_one(&mut self, m: Mbuf) -> std::result::Result<(), Mbuf> {
        let mut raw = m.into_raw().as_ptr();
        // SAFETY: this queue is owned by self alone; one owned mbuf.
        let n = unsafe { sys::rte_eth_tx_burst(self.port_id, self.queue, &mut raw, 1) };
        if n == 1 {
            Ok(())
        } else {
            // SAFETY: the driver did not take it; ownership comes back.
            Err(unsafe { Mbuf::from_raw(std::ptr::NonNull::new_unchecked(raw)) })
        }
    }

    /// Frees the transmitted mbufs the driver still holds. NIC drivers free
    /// a transmitted mbuf lazily, when a later burst needs its ring slot, so
    /// memory attached to it (a registered buffer) stays referenced, and
    /// unwritable, until enough more frames are sent. Returns how many were
    /// freed, or `None` where the driver has no such call (memif, af_packet,
    /// tap and other virtual ports free at transmit, and need none).
    pub fn reclaim(&mut self) -> Option<u32> {
        // SAFETY: this queue is owned by self alone (TxQueue is not Sync),
        // and the call touches only its transmit ring and the pools of the
        // mbufs it frees, through the shim's wrapper, which marks the puts
        // as a burst's (a pool retired meanwhile waits for them, as for a
        // burst's); 0: free all it can.
        let n = unsafe { sys::rte_eth_tx_done_cleanup(self.port_id, self.queue, 0) };
        u32::try_from(n).ok()
    }

    /// The port this queue belongs to.
    pub fn port_id(&self) -> u16 {
        self.port.id
    }

    /// The queue's index.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

fn link_status(id: u16) -> LinkStatus {
    // The driver's link_update runs (on a NIC it reads the hardware and
    // writes the device's shared link state): one caller at a time, as for
    // the other control calls.
    let _control = crate::control::control();
    let mut l = sys::rte_eth_link::default();
    // SAFETY: valid port id (callers hold the port); l is writable; the
    // control lock is held.
    if unsafe { sys::rte_eth_link_get_nowait(id, &mut l) } != 0 {
        return LinkStatus::default();
    }
    LinkStatus {
        up: l.link_status() != 0,
        speed_mbps: l.link_speed,
        full_duplex: l.link_duplex() != 0,
    }
}

fn port_by_name(name: &str) -> Option<u16> {
    let cname = CString::new(name).ok()?;
    let mut id = 0u16;
    // SAFETY: valid string and out-pointer.
    (unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) } == 0).then_some(id)
}

/// Closes and removes the device of port `name`, which no handle has open
/// (one that a failed setup already removed is gone: nothing happens).
/// Called with the control lock held.
fn remove_unopened(name: &str) {
    let Some(id) = port_by_name(name) else {
        return;
    };
    let mut info = sys::rte_eth_dev_info::default();
    // SAFETY: valid port id; info is a writable rte_eth_dev_info.
    if unsafe { sys::rte_eth_dev_info_get(id, &mut info) } != 0 || info.device.is_null() {
        return;
    }
    let control = crate::control::control();
    let _held = is_memif(name).then(|| crate::control::hold_interrupts(&control));
    // SAFETY: the port was never started and no handle holds it (the control
    // lock is held, and the claim a setup takes is gone with its failure);
    // close before remove, as `PortInner`'s drop does.
    unsafe {
        sys::rte_eth_dev_stop(id);
        sys::rte_eth_dev_close(id);
        sys::rte_dev_remove(info.device);
    }
}

fn port_name(id: u16) -> String {
    let mut buf = [0 as c_char; 64];
    // SAFETY: buf is larger than RTE_ETH_NAME_MAX_LEN; the call NUL-terminates.
    if unsafe { sys::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr()) } != 0 {
        return format!("port{id}");
    }
    // SAFETY: NUL-terminated by the call above.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Ethernet header and CRC: what a frame adds to the MTU.
pub(crate) const ETHER_OVERHEAD: u32 = 18;

/// The largest MTU a memif port takes.
///
/// DPDK 22.11's memif reports a `max_rx_pktlen` of 1518 (`RTE_ETHER_MAX_LEN`),
/// yet it carries longer frames: its receive chains mbufs when a frame
/// outgrows one, and its ring buffers (`bsize` in the devargs) may be larger
/// than 2048 bytes. The usual jumbo size is allowed; it is the one tested.
///
/// A frame must fit one ring buffer. memif's transmit would spread a longer
/// one over chained buffers, but its copying path leaves the chain flag set
/// on a buffer that later starts a frame, and that frame then arrives joined
/// to stale bytes (seen here at MTU 9000 with the default 2048-byte buffers).
/// [`Port::from_devargs`] therefore adds a `bsize` that holds a whole frame
/// and refuses a smaller one. A port opened with [`Port::open`] from `--vdev`
/// devargs must be given that `bsize` by whoever wrote them.
///
/// With the larger buffers it also shrinks the rings (`rsize`, log2 of the
/// slots), unless the devargs set them, so that a ring's buffers take about
/// the memory of memif's default 1024 of 2048 bytes: 256 slots of 9216 bytes
/// at MTU 9000. Rings of 1024 such buffers (9 MiB each) cost raw frames and
/// emx alike 7-20% of their message rate and 1 MiB bandwidth here.
pub const MEMIF_MAX_MTU: u16 = 9000;

/// memif's ring buffer size when the devargs give none.
const MEMIF_DEFAULT_BSIZE: u32 = 2048;

/// Whether a memif server listens on `socket` (its `socket=` devarg). DPDK
/// 22.11 binds it in the abstract namespace unless the devargs say
/// `socket-abstract=no`: no file appears, and `/proc/net/unix` lists it as
/// `@path`. A client whose server does not listen yet fails to start, so a
/// client started beside its server (another thread or process) waits for
/// this first.
///
/// ```
/// assert!(!dpdk_ffi::memif_listening("/tmp/emx-no-such-memif.sock"));
/// ```
pub fn memif_listening(socket: &str) -> bool {
    let abstract_name = format!("@{socket}");
    std::path::Path::new(socket).exists()
        || std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some(abstract_name.as_str()))
        })
}

/// memif's ring slots (log2) when the devargs give none.
const MEMIF_DEFAULT_RSIZE: u32 = 10;

/// Why device name `name` (the devargs before the first comma) names
/// nothing DPDK can probe, where that is plain: a bare word that is neither a
/// virtual device (`net_<driver><n>`) nor a PCI address. (Such a name failed
/// the probe with 'Bad address'.)
fn not_a_device(name: &str) -> Option<String> {
    let bare = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !bare || name.starts_with("net_") || name.starts_with("eth_") {
        return None;
    }
    Some(format!(
        "`{name}` is not a device DPDK can probe: give virtual device devargs such as \
         net_memif0,role=server,socket=/tmp/emx.sock or net_af_packet0,iface={name} (for a \
         kernel interface), or a NIC's PCI address such as 0000:03:00.0"
    ))
}

/// Why PCI address `name` names no device, where this machine says so: no
/// such device under /sys/bus/pci (where /sys shows the bus at all).
fn no_such_pci_device(name: &str) -> Option<String> {
    let full = crate::pci_canonical(name)?;
    let bus = std::path::Path::new("/sys/bus/pci/devices");
    (bus.is_dir() && !bus.join(full).exists()).then(|| {
        format!(
            "no PCI device {name} on this machine (`lspci -D` lists them, with the addresses \
             to give)"
        )
    })
}

/// Virtual devices that open a kernel interface, which takes root's
/// capabilities.
fn needs_root(name: &str) -> bool {
    matches!(
        driver_name(name),
        "net_af_packet" | "net_af_xdp" | "net_tap" | "net_tun"
    )
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The value devargs give `key` (the last, where they give it twice).
fn devarg<'a>(devargs: &'a str, key: &str) -> Option<&'a str> {
    devargs
        .split(',')
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v)
        .next_back()
}

/// The devargs keys DPDK 22.11's memif takes.
const MEMIF_KEYS: [&str; 11] = [
    "id",
    "role",
    "bsize",
    "rsize",
    "socket",
    "socket-abstract",
    "owner-uid",
    "owner-gid",
    "mac",
    "zero-copy",
    "secret",
];

/// Refuses memif devargs with a key memif does not take: DPDK 22.11's memif
/// then ignores every argument of the device (a client of the default
/// socket, whatever the rest said), and the start fails far from the cause.
fn memif_keys(name: &str, devargs: &str) -> Result<()> {
    for kv in devargs
        .split(',')
        .skip(1)
        .map(str::trim)
        .filter(|kv| !kv.is_empty())
    {
        let key = kv.split('=').next().unwrap_or_default().trim();
        if !kv.contains('=') || !MEMIF_KEYS.contains(&key) {
            return Err(Error::Config(format!(
                "`{name}`: memif takes no `{kv}` (its keys: {}; each as key=value)",
                MEMIF_KEYS.join(", ")
            )));
        }
    }
    Ok(())
}

/// For memif devargs (device `name`) asked for `mtu`: what to add to them
/// (`,bsize=..,rsize=..`) so that a frame fits one ring buffer, or `None`
/// when they need nothing. An explicit `bsize` too small for the frame is a
/// configuration error.
fn memif_sizing(name: &str, devargs: &str, mtu: Option<u16>) -> Result<Option<String>> {
    let Some(mtu) = mtu else { return Ok(None) };
    if driver_name(name) != "net_memif" {
        return Ok(None);
    }
    // memif frames carry no CRC: header and payload.
    let frame = u32::from(mtu) + 14;
    if let Some(b) = devarg(devargs, "bsize") {
        return match b.trim().parse::<u32>() {
            Ok(b) if b >= frame => Ok(None),
            _ => Err(Error::Config(format!(
                "`{name}` has bsize={b}, but MTU {mtu} needs memif ring buffers of at least \
                 {frame} bytes (memif corrupts frames split over several); raise bsize or leave \
                 it out to have it sized for the MTU"
            ))),
        };
    }
    if frame <= MEMIF_DEFAULT_BSIZE {
        return Ok(None);
    }
    // A whole number of KiB: 9216 for MTU 9000.
    let bsize = frame.div_ceil(1024) * 1024;
    if devarg(devargs, "rsize").is_some() {
        return Ok(Some(format!(",bsize={bsize}")));
    }
    // The power of two nearest the default ring's memory over the buffer size.
    let slots = (MEMIF_DEFAULT_BSIZE << MEMIF_DEFAULT_RSIZE) as f64 / f64::from(bsize);
    let rsize = slots.log2().round().max(1.0) as u32;
    Ok(Some(format!(",bsize={bsize},rsize={rsize}")))
}

/// The driver's name in a port's device info (empty when it has none).
fn info_driver(info: &sys::rte_eth_dev_info) -> &[u8] {
    if info.driver_name.is_null() {
        return &[];
    }
    // SAFETY: a non-null driver name from rte_eth_dev_info_get is a static
    // NUL-terminated string of the driver.
    unsafe { CStr::from_ptr(info.driver_name) }.to_bytes()
}

/// Whether the port's driver carries frames longer than its
/// `max_rx_pktlen`, chaining buffers without asking for the scatter offload
/// (memif: see [`MEMIF_MAX_MTU`]).
fn chains_long_frames(info: &sys::rte_eth_dev_info) -> bool {
    info_driver(info) == b"net_memif"
}

/// Whether the port's driver keeps mbufs of its pool after the port is
/// closed: DPDK 22.11's `net_af_xdp` fills its AF_XDP fill ring from the pool
/// and does not free those mbufs at close.
fn keeps_fill_ring(info: &sys::rte_eth_dev_info) -> bool {
    info_driver(info) == b"net_af_xdp"
}

/// Whether device `name` is a memif port (`net_memif0`, ...): the vdev bus
/// gives a device to the driver whose name starts it.
fn is_memif(name: &str) -> bool {
    name.starts_with("net_memif")
}

/// `net_memif0` -> `net_memif`: the driver a vdev name asks for.
fn driver_name(name: &str) -> &str {
    name.trim_end_matches(|c: char| c.is_ascii_digit())
}

/// True when `name` is a virtual device whose driver the EAL has not loaded.
/// Drivers live as `librte_<name without the bus prefix>` in the PMD directory
/// when DPDK is linked shared (each in a package of its own: a missing memif
/// driver used to be reported as bad devargs); a static build has some in.
fn driver_missing(name: &str) -> bool {
    let looks_vdev =
        name.starts_with("net_") || name.starts_with("crypto_") || name.starts_with("event_");
    if !looks_vdev {
        return false;
    }
    let driver = driver_name(name);
    if cfg!(emx_dpdk_static) && STATIC_VDEV_DRIVERS.contains(&driver) {
        return false;
    }
    let dirs = pmd_dirs();
    // No driver directory where DPDK's packages put one: a DPDK installed
    // elsewhere, which this cannot judge.
    if dirs.is_empty() {
        return false;
    }
    // `librte_net_memif.so` comes with the -dev package, `.so.23` with the
    // driver's own: either is the driver there.
    let prefix = format!("librte_{driver}.so");
    !dirs.iter().any(|dir| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        })
    })
}

/// Drivers that a static build links in (see build.rs).
const STATIC_VDEV_DRIVERS: &[&str] = &["net_memif", "net_ring", "net_af_packet", "net_tap"];

fn pmd_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs = Vec::new();
    for base in [
        "/usr/lib/x86_64-linux-gnu/dpdk",
        "/usr/lib/aarch64-linux-gnu/dpdk",
        "/usr/local/lib/x86_64-linux-gnu/dpdk",
        "/usr/local/lib/aarch64-linux-gnu/dpdk",
        "/usr/local/lib/dpdk",
        "/usr/lib64/dpdk",
    ] {
        if let Ok(rd) = std::fs::read_dir(base) {
            dirs.extend(rd.flatten().map(|e| e.path()));
        }
    }
    dirs
}

/// `aa:bb:cc:dd:ee:ff`.
pub(crate) fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_word_is_not_a_device() {
        for name in ["nosuch", "eth0", "ens1f0"] {
            let e = not_a_device(name).expect(name);
            assert!(
                e.contains("is not a device") && e.contains("0000:03:00.0"),
                "{e}"
            );
        }
        for name in [
            "net_memif0",
            "net_af_packet1",
            "eth_ring0",
            "0000:03:00.0",
            "03:00.1",
        ] {
            assert_eq!(not_a_device(name), None, "{name}");
        }
    }

    #[test]
    fn memif_devargs_with_a_key_memif_does_not_take_are_refused() {
        let ok = "net_memif0,role=server,id=0,socket=/tmp/s,socket-abstract=no,bsize=9216,rsize=8";
        assert!(memif_keys("net_memif0", ok).is_ok());
        assert!(memif_keys("net_memif0", "net_memif0").is_ok());
        assert!(memif_keys("net_memif0", "net_memif0,role=server,").is_ok());
        for bad in [
            "net_memif0,bogus=1,role=server",
            "net_memif0,role=client,sokcet-abstract=no",
            "net_memif0,role",
        ] {
            let e = memif_keys("net_memif0", bad).unwrap_err().to_string();
            assert!(
                e.contains("memif takes no") && e.contains("socket-abstract"),
                "{e}"
            );
        }
    }

    #[test]
    fn memif_sizing_holds_a_whole_frame() {
        let m = "net_memif0,role=server,socket=/tmp/s";
        let sizing = |devargs: &str, mtu| memif_sizing("net_memif0", devargs, mtu);
        // Frames that fit the default 2048-byte buffers need nothing.
        for mtu in [None, Some(1500), Some(2034)] {
            assert_eq!(sizing(m, mtu).unwrap(), None);
        }
        // Larger ones get buffers for a frame, and rings of about the
        // default's memory.
        let extra = |mtu| sizing(m, Some(mtu)).unwrap().unwrap();
        assert_eq!(extra(2035), ",bsize=3072,rsize=9");
        assert_eq!(extra(9000), ",bsize=9216,rsize=8");
        // Other drivers are left alone.
        assert_eq!(
            memif_sizing("net_ring0", "net_ring0", Some(9000)).unwrap(),
            None
        );
        // Ring slots given are kept.
        let rsize = format!("{m},rsize=11");
        assert_eq!(
            sizing(&rsize, Some(9000)).unwrap().as_deref(),
            Some(",bsize=9216")
        );
        // A bsize given is kept when it holds the frame, refused when not.
        assert_eq!(
            sizing(&format!("{m},bsize=9014"), Some(9000)).unwrap(),
            None
        );
        for small in [format!("{m},bsize=2048"), format!("{m},bsize=x")] {
            let err = sizing(&small, Some(9000)).unwrap_err();
            assert!(
                matches!(&err, Error::Config(msg) if msg.contains("at least 9014 bytes")),
                "{err}"
            );
        }
    }
}

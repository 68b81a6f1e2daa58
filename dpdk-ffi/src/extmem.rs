//! External memory: regions outside DPDK's heap, registered with DPDK, whose
//! slices are attached to mbufs as external buffers. This is how emx sends
//! without copying: a frame's payload mbuf points into the application's
//! registered buffer, and the buffer is released when the last mbuf pointing
//! into it is freed.
//!
//! Ownership: an [`ExtMem`] region lends out disjoint ranges as [`ExtBuf`]s. A
//! range is writable only while no mbuf refers to it, and goes back to the
//! region, with the buffer's release callback run once, when the `ExtBuf` and
//! every mbuf attached from it are gone.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use crate::eal::{hugepages_usable, Eal};
use crate::error::Errno;
use crate::error::{Error, Result, ToResult};
use crate::mbuf::Mbuf;
use crate::port::Port;
use crate::sys;

const HUGE_PAGE: usize = 2 << 20;

/// A memory region registered with DPDK (`rte_extmem_register`): hugepages
/// when there are free ones, ordinary locked pages otherwise.
#[derive(Clone)]
pub struct ExtMem(Arc<RegionInner>);

struct RegionInner {
    base: NonNull<u8>,
    len: usize,
    page_size: usize,
    hugepages: bool,
    /// Its pages cannot move (hugepages, or ordinary ones mlock took).
    locked: bool,
    /// IOVA of each page, for attaching to mbufs.
    iovas: Vec<u64>,
    /// For each page, the index one past the last page of the run of pages
    /// contiguous in IO address space that it belongs to: a frame's share of
    /// a buffer is found in constant time, not by walking its pages.
    run_ends: Vec<u32>,
    /// Ranges lent out (start -> end), so that no two buffers overlap.
    lent: Mutex<BTreeMap<usize, usize>>,
    /// Ports whose devices the region is DMA-mapped for (unmapped on drop;
    /// holding them keeps the devices there until then).
    mapped: Mutex<Vec<Port>>,
    eal: Eal,
}

// SAFETY: the region is plain memory; all access to its bytes goes through
// ExtBuf, whose ranges are disjoint (enforced by `lent`) but for the handles
// `share` makes on one range, which write it only as its one reference
// (`as_mut_slice`'s count check); the bookkeeping is behind a Mutex.
unsafe impl Send for RegionInner {}
// SAFETY: as above.
unsafe impl Sync for RegionInner {}

impl std::fmt::Debug for ExtMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtMem")
            .field("len", &self.0.len)
            .field("page_size", &self.0.page_size)
            .field("hugepages", &self.0.hugepages)
            .finish()
    }
}

/// For each page, one past the last page of its run of pages contiguous in IO
/// address space (see `RegionInner::run_ends`).
fn run_ends(iovas: &[u64], page_size: u64) -> Vec<u32> {
    let mut ends = vec![0u32; iovas.len()];
    let mut end = iovas.len() as u32;
    for i in (0..iovas.len()).rev() {
        if i + 1 < iovas.len() && iovas[i + 1] != iovas[i].wrapping_add(page_size) {
            end = i as u32 + 1;
        }
        ends[i] = end;
    }
    ends
}

/// Whether pages `first..=last` lie in one run contiguous in IO address space.
fn in_one_run(run_ends: &[u32], first: usize, last: usize) -> bool {
    run_ends[first] as usize > last
}

impl ExtMem {
    /// Maps and registers `len` bytes (rounded up to whole pages), on hugepages
    /// when enough are free and on ordinary pages otherwise.
    pub fn new(eal: &Eal, len: usize) -> Result<ExtMem> {
        let want_mb = u32::try_from(len.div_ceil(1 << 20)).unwrap_or(u32::MAX);
        let huge = hugepages_usable(want_mb).is_ok();
        match Self::with_pages(eal, len, huge) {
            Err(Error::Mmap { .. }) if huge => Self::with_pages(eal, len, false),
            r => r,
        }
    }

    /// Like [`ExtMem::new`], choosing the page kind: hugepages (`true`) or
    /// ordinary pages.
    pub fn with_pages(eal: &Eal, len: usize, hugepages: bool) -> Result<ExtMem> {
        if len == 0 {
            return Err(Error::ExtMem("a region must not be empty"));
        }
        // SAFETY: sysconf has no preconditions.
        let small = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let page_size = if hugepages { HUGE_PAGE } else { small };
        let len = len.div_ceil(page_size) * page_size;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        if hugepages {
            // 2 MiB pages whatever the system's default size: a host booted
            // with default_hugepagesz=1G would round the region up to 1 GiB
            // pages, and drop's munmap of 2 MiB multiples would then fail.
            flags |= libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT);
        }
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing; nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Mmap {
                len,
                kind: if hugepages {
                    "hugepages"
                } else {
                    "ordinary pages"
                },
                source: std::io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p as *mut u8).expect("mmap never returns null on success");
        // Physical addresses must not move under DMA: ordinary pages are
        // locked. Without the privilege (CAP_IPC_LOCK, or a locked-memory
        // limit past the region) virtual devices still work, as they use
        // virtual addresses; a NIC given physical ones would read and write
        // wherever the pages had moved, so `dma_map` refuses one then.
        // SAFETY: the range was just mapped.
        let locked = hugepages || unsafe { libc::mlock(p, len) } == 0;
        let pages = len / page_size;
        let iovas: Vec<u64> = (0..pages)
            .map(|i| {
                let va = base.as_ptr() as usize + i * page_size;
                if eal.iova_is_va() {
                    va as u64
                } else {
                    // SAFETY: va is mapped and populated.
                    unsafe { sys::rte_mem_virt2phy(va as *const libc::c_void) }
                }
            })
            .collect();
        // RTE_BAD_IOVA, ((rte_iova_t)-1), a cast bindgen does not carry.
        if iovas.contains(&u64::MAX) {
            // SAFETY: the range was mapped above and is not used elsewhere.
            unsafe { libc::munmap(p, len) };
            return Err(Error::ExtMem(
                "the physical addresses of the region's pages cannot be read (not root?): DMA \
                 needs them in IOVA-as-PA mode; run as root, or use VFIO with --iova-mode=va",
            ));
        }
        let mut iova_arg = iovas.clone();
        let control = crate::control::control();
        // SAFETY: base..base+len is mapped, page-aligned, a whole number of pages
        // of page_size, and iova_arg has one entry per page.
        let r = unsafe {
            sys::rte_extmem_register(p, len, iova_arg.as_mut_ptr(), pages as u32, page_size)
        }
        .check("rte_extmem_register");
        drop(control);
        if let Err(e) = r {
            // SAFETY: unmapping what was mapped above; nothing refers to it.
            unsafe { libc::munmap(p, len) };
            return Err(e);
        }
        let run_ends = run_ends(&iovas, page_size as u64);
        Ok(ExtMem(Arc::new(RegionInner {
            base,
            len,
            page_size,
            hugepages,
            locked,
            iovas,
            run_ends,
            lent: Mutex::new(BTreeMap::new()),
            mapped: Mutex::new(Vec::new()),
            eal: eal.clone(),
        })))
    }

    /// Size in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Makes the region reachable for DMA by `port`'s device, so that a NIC
    /// can send from it without a copy. `rte_extmem_register` maps nothing:
    /// a NIC behind VFIO and an IOMMU cannot read a page it was not given,
    /// and its frames would go out as garbage or not at all. Returns
    /// `Ok(true)` when the device's bus took the mapping (virtual devices
    /// take it as a no-op), `Ok(false)` when it says none is needed (a PCI
    /// NIC without VFIO). Mapping a port twice is a no-op. The mapping lasts
    /// as long as the region. A NIC (a PCI device) that would be given the
    /// physical addresses of ordinary pages that could not be locked is
    /// refused: they may move under it.
    pub fn dma_map(&self, port: &Port) -> Result<bool> {
        if !self.0.locked && !self.0.eal.iova_is_va() && crate::is_pci_address(port.name()) {
            return Err(Error::ExtMem(
                "the region's ordinary pages could not be locked (mlock: no CAP_IPC_LOCK, or \
                 `ulimit -l` too low), and a NIC given their physical addresses (IOVA as PA) \
                 would follow them wherever they moved: reserve hugepages (`sudo bash \
                 scripts/setup.sh`), raise the limit, or use VFIO with --iova-mode=va",
            ));
        }
        let _control = crate::control::control();
        let mut mapped = self.0.mapped.lock().unwrap_or_else(|e| e.into_inner());
        if mapped.iter().any(|p| p.id() == port.id()) {
            return Ok(true);
        }
        let dev = port.device()?;
        let runs = self.0.iova_runs();
        for (i, &(offset, iova, len)) in runs.iter().enumerate() {
            // SAFETY: dev is the live device of `port`; the run lies inside
            // this registered region.
            let r = unsafe {
                sys::rte_dev_dma_map(dev, self.0.base.as_ptr().add(offset).cast(), iova, len)
            };
            if r == 0 {
                continue;
            }
            let errno = if r == -1 {
                Errno::last()
            } else {
                Errno::from_ret(r)
            };
            // SAFETY: exactly the runs mapped above, on the same device.
            unsafe { self.0.unmap(dev, &runs[..i]) };
            if i == 0 && errno.0 == libc::ENOTSUP {
                // The bus or driver reaches memory without a mapping.
                return Ok(false);
            }
            return Err(Error::Call {
                call: "rte_dev_dma_map",
                errno,
            });
        }
        mapped.push(port.clone());
        Ok(true)
    }

    /// Never true: regions are at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> usize {
        self.0.page_size
    }

    /// True when the region is on hugepages.
    pub fn is_hugepages(&self) -> bool {
        self.0.hugepages
    }

    /// Lends the first free range of `len` bytes starting at a multiple of
    /// `align` (a power of two; 64 keeps buffers on their own cache lines).
    /// Fails when no gap is large enough.
    pub fn alloc(&self, len: usize, align: usize) -> Result<ExtBuf> {
        if len == 0 || !align.is_power_of_two() {
            return Err(Error::ExtMem(
                "allocation must be non-empty, aligned to a power of two",
            ));
        }
        // Found and claimed under one lock: two threads cannot pick one gap.
        let offset = {
            let mut lent = self.0.lent.lock().unwrap_or_else(|e| e.into_inner());
            let mut at = 0usize;
            let mut found = None;
            for (&start, &end) in lent.iter() {
                if start >= at && start - at >= len {
                    found = Some(at);
                    break;
                }
                at = end.next_multiple_of(align);
            }
            match found
                .or_else(|| (at.checked_add(len).is_some_and(|e| e <= self.0.len)).then_some(at))
            {
                Some(o) => {
                    lent.insert(o, o + len);
                    o
                }
                None => return Err(Error::ExtMem("no free range of that size in the region")),
            }
        };
        Ok(self.claimed(offset, len, || {}))
    }

    /// Bytes lent out now.
    pub fn lent_bytes(&self) -> usize {
        self.0
            .lent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(s, e)| e - s)
            .sum()
    }

    /// Lends `offset..offset + len` as a buffer. Fails when the range is out
    /// of the region or overlaps a buffer still lent out.
    pub fn buffer(&self, offset: usize, len: usize) -> Result<ExtBuf> {
        self.buffer_with(offset, len, || {})
    }

    /// Like [`buffer`](Self::buffer); `on_release` runs once, when the buffer
    /// and every mbuf attached from it are gone and the range is free again.
    /// It runs on whichever thread freed the last of them, a polling thread
    /// inside a burst or DPDK's interrupt thread included, from a C callback:
    /// it must not block for long, and a panic in it aborts the process.
    pub fn buffer_with(
        &self,
        offset: usize,
        len: usize,
        on_release: impl FnOnce() + Send + 'static,
    ) -> Result<ExtBuf> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.0.len && len > 0);
        let Some(end) = end else {
            return Err(Error::ExtMem("buffer range is empty or outside the region"));
        };
        {
            let mut lent = self.0.lent.lock().unwrap_or_else(|e| e.into_inner());
            let before = lent.range(..end).next_back();
            if before.is_some_and(|(_, &e)| e > offset) {
                return Err(Error::ExtMem(
                    "buffer range overlaps a buffer still lent out",
                ));
            }
            lent.insert(offset, end);
        }
        Ok(self.claimed(offset, len, on_release))
    }

    /// The buffer over `offset..offset + len`, a range just claimed in `lent`.
    fn claimed(
        &self,
        offset: usize,
        len: usize,
        on_release: impl FnOnce() + Send + 'static,
    ) -> ExtBuf {
        let state = Box::new(BufState {
            shinfo: sys::rte_mbuf_ext_shared_info {
                free_cb: Some(release_cb),
                fcb_opaque: std::ptr::null_mut(),
                refcnt: 1,
            },
            region: self.0.clone(),
            offset,
            on_release: Some(Box::new(on_release)),
        });
        let state = NonNull::from(Box::leak(state));
        // SAFETY: state was just leaked and is not shared yet.
        unsafe { (*state.as_ptr()).shinfo.fcb_opaque = state.as_ptr() as *mut libc::c_void };
        ExtBuf { state, offset, len }
    }
}

impl RegionInner {
    /// The region as runs of contiguous IOVAs: (offset, iova, length).
    fn iova_runs(&self) -> Vec<(usize, u64, usize)> {
        let mut runs: Vec<(usize, u64, usize)> = Vec::new();
        for (i, &iova) in self.iovas.iter().enumerate() {
            match runs.last_mut() {
                Some((_, start, len)) if *start + *len as u64 == iova => *len += self.page_size,
                _ => runs.push((i * self.page_size, iova, self.page_size)),
            }
        }
        runs
    }

    /// Undoes `rte_dev_dma_map` of `runs` for `dev`, ignoring failures (a
    /// second device in the same VFIO container shares the first's mapping,
    /// which only one unmap removes).
    ///
    /// # Safety
    /// `dev` must be a live device, and `runs` ranges of this region.
    unsafe fn unmap(&self, dev: *mut sys::rte_device, runs: &[(usize, u64, usize)]) {
        for &(offset, iova, len) in runs {
            // SAFETY: per the contract above.
            unsafe {
                sys::rte_dev_dma_unmap(dev, self.base.as_ptr().add(offset).cast(), iova, len)
            };
        }
    }
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        let _control = crate::control::control();
        let ports = std::mem::take(self.mapped.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !ports.is_empty() {
            let runs = self.iova_runs();
            for p in &ports {
                if let Ok(dev) = p.device() {
                    // SAFETY: the port is held, so its device lives; the runs
                    // are this region's, mapped for it by dma_map.
                    unsafe { self.unmap(dev, &runs) };
                }
            }
        }
        // SAFETY: every buffer (and every mbuf attached from one) holds a clone
        // of the region, so none is left: unregister, then unmap.
        unsafe {
            sys::rte_extmem_unregister(self.base.as_ptr() as *mut libc::c_void, self.len);
            libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len);
        }
    }
}

/// What DPDK's free callback needs: the shared info block whose `refcnt`
/// counts the owner (the `ExtBuf`) plus every mbuf attached from it.
#[repr(C)]
struct BufState {
    shinfo: sys::rte_mbuf_ext_shared_info,
    region: Arc<RegionInner>,
    offset: usize,
    on_release: Option<Box<dyn FnOnce() + Send>>,
}

/// DPDK's `free_cb`: the reference count reached zero.
unsafe extern "C" fn release_cb(_addr: *mut libc::c_void, opaque: *mut libc::c_void) {
    // DPDK may have read the last count with a relaxed load (its fast path
    // for a count of 1): order the release after every other holder's use of the
    // bytes and the state, which their decrements (release) published.
    fence(Ordering::Acquire);
    // SAFETY: opaque is the BufState leaked in buffer_with; the count reached
    // zero exactly once, so this is its only release.
    let state = unsafe { Box::from_raw(opaque as *mut BufState) };
    state
        .region
        .lent
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&state.offset);
    if let Some(f) = state.on_release {
        f();
    }
}

/// A range of an [`ExtMem`] region, lent out to its handles. Write it while no
/// mbuf and no other handle refers to it, then attach slices of it to mbufs to
/// send them with no copy; [`share`](ExtBuf::share) gives more handles to the
/// same bytes, to send them in several requests at once. Dropping a handle gives up its
/// reference; the range goes back to the region (and the release callback
/// runs) when the last handle is dropped and the last mbuf freed.
pub struct ExtBuf {
    state: NonNull<BufState>,
    offset: usize,
    len: usize,
}

// SAFETY: the state block is only touched through its reference count and,
// on release, by whoever drops the count to zero. (Not `Sync`: DPDK updates a
// count of 1 with a plain store, as its only holder may, so two threads must
// not add references through one handle at once.)
unsafe impl Send for ExtBuf {}

impl ExtBuf {
    fn shinfo(&self) -> *mut sys::rte_mbuf_ext_shared_info {
        // SAFETY: the state lives while this owner's reference is held.
        unsafe { &raw mut (*self.state.as_ptr()).shinfo }
    }

    /// The reference count: this handle, the other handles and every mbuf
    /// attached from them.
    fn refcnt(&self) -> &AtomicU16 {
        // SAFETY: the field is a 2-aligned u16 that lives while this handle's
        // reference is held; DPDK updates it with atomic operations, except for
        // a plain store by a holder that sees itself the only one (a count of
        // 1), which no other holder can then race with.
        unsafe { AtomicU16::from_ptr(&raw mut (*self.shinfo()).refcnt) }
    }

    /// Adds a reference (a handle or an attached mbuf) unless `limit`
    /// references exist already. A compare-and-swap, so that holders on
    /// several threads cannot take the 16-bit count past the limit together.
    fn add_ref(&self, limit: u16) -> Result<()> {
        let count = self.refcnt();
        let mut now = count.load(Ordering::Relaxed);
        loop {
            if now >= limit {
                return Err(Error::ExtMem("too many references to one buffer"));
            }
            // (Relaxed, as Arc's clone: the new reference comes from one held.)
            match count.compare_exchange_weak(now, now + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(seen) => now = seen,
            }
        }
    }

    fn region(&self) -> &RegionInner {
        // SAFETY: as in shinfo().
        unsafe { &(*self.state.as_ptr()).region }
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: offset < region length, checked when lent.
        unsafe { self.region().base.as_ptr().add(self.offset) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: buffers are at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Offset in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Another handle to the same bytes, to read them and send them:
    /// while more than one handle (or any mbuf) refers to the bytes, no
    /// handle can write them ([`as_mut_slice`](Self::as_mut_slice) is
    /// `None`). The range goes back to the region when the last handle and
    /// the last mbuf are gone. Sending one buffer in several requests at once
    /// (to several peers, or a window of sends of the same data) takes one
    /// handle per request.
    ///
    /// Fails when the buffer has [`MAX_SHARES`](Self::MAX_SHARES) references
    /// besides this handle already: other handles and attached mbufs (the
    /// count is DPDK's 16-bit one, which both use).
    ///
    /// ```no_run
    /// # fn f(region: &dpdk_ffi::ExtMem) -> dpdk_ffi::Result<()> {
    /// let mut buf = region.alloc(4096, 64)?;
    /// buf.as_mut_slice().expect("one handle, no mbuf").fill(7);
    /// let other = buf.share()?;
    /// assert!(buf.as_mut_slice().is_none(), "two handles: read-only");
    /// drop(other);
    /// assert!(buf.as_mut_slice().is_some());
    /// # Ok(()) }
    /// ```
    pub fn share(&self) -> Result<ExtBuf> {
        // The new handle's reference (this one's and MAX_SHARES others at
        // most); the state lives while any is held.
        self.add_ref(Self::MAX_SHARES + 1)?;
        Ok(ExtBuf {
            state: self.state,
            offset: self.offset,
            len: self.len,
        })
    }

    /// The most references [`share`](Self::share) lets a buffer have:
    /// half of DPDK's 16-bit count, leaving the rest to attached mbufs.
    pub const MAX_SHARES: u16 = u16::MAX / 2;

    /// The most references [`attach`](Self::attach) lets a buffer have (its
    /// handles and attached mbufs): one short of what DPDK's 16-bit count
    /// holds. An attach past it fails, as one that finds no contiguous IO
    /// addresses does; the engine then treats the frame as lost.
    pub const MAX_REFS: u16 = u16::MAX - 1;

    /// Other references to this buffer's bytes: mbufs attached to it (sent
    /// or waiting to be) and other handles ([`share`](Self::share)).
    pub fn in_flight(&self) -> u16 {
        self.refcnt().load(Ordering::Relaxed).saturating_sub(1)
    }

    /// The bytes, to read.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is lent to this buffer's handles alone, and none
        // writes while another handle or an mbuf refers to it (as_mut_slice).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, to write; `None` while an mbuf refers to them (the NIC may
    /// be reading them, or a retransmission may need them unchanged).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if self.in_flight() != 0 {
            return None;
        }
        // The last other holder (an mbuf freed on the polling thread, say)
        // read the bytes before its decrement: the writes come after.
        fence(Ordering::Acquire);
        // SAFETY: lent to this buffer's handles alone, the count says this
        // is the only one and no mbuf refers to it, and &mut self excludes any
        // other borrow (nor can a new handle be shared from this one meanwhile).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) })
    }

    /// Bytes from `offset` (within this buffer) that are contiguous in IO
    /// address space, up to the buffer's end: the most one mbuf can carry from
    /// there. Always the rest of the buffer when IOVA is VA; up to a page
    /// boundary (or further, where the pages are physically adjacent) with
    /// physical addresses.
    pub fn contiguous_len(&self, offset: usize) -> usize {
        if offset >= self.len {
            return 0;
        }
        let region = self.region();
        let at = self.offset + offset;
        let end = self.offset + self.len;
        let run_end = region.run_ends[at / region.page_size] as usize * region.page_size;
        run_end.min(end) - at
    }

    /// Attaches `offset..offset + len` of this buffer to `mbuf` (fresh from a
    /// pool: empty, one segment) as its data. No byte is copied. Chain it after
    /// a header mbuf to send a frame whose payload comes from here.
    pub fn attach(&self, mbuf: &mut Mbuf, offset: usize, len: usize) -> Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len);
        if end.is_none() || len > usize::from(u16::MAX) {
            return Err(Error::OutOfBounds {
                offset,
                len,
                limit: self.len.min(usize::from(u16::MAX)),
            });
        }
        // (Direct, with no clone: DPDK attaches only such an mbuf, and one
        // that was indirect would leak the mbuf it pointed at when freed.)
        if mbuf.pkt_len() != 0 || mbuf.nb_segs() != 1 || !mbuf.owns_data() {
            return Err(Error::Config(
                "only an empty, direct, single-segment mbuf can be attached".into(),
            ));
        }
        if len == 0 {
            // (At the region's end, its page would lie past the page table.)
            return Err(Error::Config("an empty slice has nothing to attach".into()));
        }
        let region = self.region();
        let at = self.offset + offset;
        let page = at / region.page_size;
        let last_page = (at + len.max(1) - 1) / region.page_size;
        let iova = region.iovas[page] + (at % region.page_size) as u64;
        // Every page of the slice in one run (not just its first and last
        // pages in line: a page between them may lie elsewhere).
        if !in_one_run(&region.run_ends, page, last_page) {
            return Err(Error::ExtMem(
                "slice spans pages that are not contiguous in IO address space",
            ));
        }
        // The mbuf's reference: from here on the count includes it.
        self.add_ref(Self::MAX_REFS)?;
        // SAFETY: the shinfo outlives the mbuf (its count includes it); the
        // address range lies within this buffer; the mbuf is owned, empty and
        // direct (checked above).
        unsafe {
            sys::rte_pktmbuf_attach_extbuf(
                mbuf.as_ptr(),
                self.ptr().add(offset) as *mut libc::c_void,
                iova,
                len as u16,
                self.shinfo(),
            );
            let m = &mut *mbuf.as_ptr();
            m.data_len = len as u16;
            m.pkt_len = len as u32;
        }
        Ok(())
    }
}

impl Drop for ExtBuf {
    fn drop(&mut self) {
        // Same release rule as DPDK's __rte_pktmbuf_free_extbuf.
        // SAFETY: gives up this owner's reference; whoever brings the count to
        // zero (here or in an mbuf free) runs the release exactly once.
        unsafe {
            if sys::rte_mbuf_ext_refcnt_update(self.shinfo(), -1) == 0 {
                release_cb(
                    self.ptr() as *mut libc::c_void,
                    self.state.as_ptr() as *mut libc::c_void,
                );
            }
        }
    }
}

impl std::fmt::Debug for ExtBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtBuf")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{in_one_run, run_ends};

    /// A slice is attached only when every page it spans is in one run: its
    /// first and last pages in line with a page between them elsewhere used
    /// to pass (the check looked at those two only).
    #[test]
    fn a_slice_must_lie_in_one_run() {
        let p = 4096;
        let ends = run_ends(&[10 * p, 50 * p, 12 * p, 13 * p], p);
        assert!(!in_one_run(&ends, 0, 2), "page 1 is elsewhere");
        assert!(in_one_run(&ends, 2, 3));
        assert!(in_one_run(&ends, 1, 1));
        assert!(!in_one_run(&ends, 1, 2));
    }

    #[test]
    fn runs_end_where_io_addresses_jump() {
        let p = 4096;
        // Pages 0-2 follow each other, 3 stands alone, 4-5 follow each other.
        let iovas = [10 * p, 11 * p, 12 * p, 40 * p, 7 * p, 8 * p];
        assert_eq!(run_ends(&iovas, p), [3, 3, 3, 4, 6, 6]);
        assert_eq!(run_ends(&[p], p), [1]);
        assert!(run_ends(&[], p).is_empty());
    }
}

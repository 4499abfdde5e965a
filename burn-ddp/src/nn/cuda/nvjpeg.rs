//! nvJPEG, loaded at run time like cuDNN: one batched decoder per device, decoding a batch's
//! JPEGs straight into device memory on a stream of the caller's, as interleaved RGB bytes
//! (nvJPEG's own colour conversion). With `BURN_DDP_DECODE_OUTPUT=planes` a batch of colour
//! JPEGs (three components, chroma at full or half resolution each way) is decoded to their Y,
//! Cb and Cr planes as they are coded instead, and the crop kernel converts to RGB as it samples
//! them: nvJPEG's conversion kernel and its full-size RGB copy of every image are skipped (half
//! the decode's GPU time, 0.17 GiB less memory a batch of 256 photos, closer to the CPU
//! decode), but nvJPEG's calls keep the submitting thread longer, which on H100s costs more
//! than it saves (2026-12-07: ResNet-18 on ImageNet-size photos, bound by the decode, trained
//! 10 % slower with the planes). A batch with any other JPEG (greyscale, CMYK, other chroma
//! factors) is decoded to RGB either way.
//!
//! The decoder takes the hardware backend (the JPEG engines of A100, H100 and H200: Huffman
//! decoding included, no host thread busy) where the GPU has one, and nvJPEG's default backend
//! (CUDA kernels, Huffman decoding on the calling host thread) elsewhere; [`Backend`] says which.
//! Decoding runs on the decoder's own stream, overlapping the caller's computation; two decode
//! slots (an nvJPEG state and the memory decoded into) alternate, so a batch can be submitted
//! (by the data loader's thread) while the training stream still reads the previous one.
//!
//! A batch's encoded bytes stay with its slot until the slot's next decode has waited for this
//! one to end: nvJPEG does not promise to have read them when its call returns.

use crate::error::{Error, Result};
use cudarc::driver::CudaStream;
use cudarc::driver::sys as driver;
use libloading::Library;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

type RawHandle = *mut c_void;
type RawState = *mut c_void;

/// An nvJPEG state, and the batch size and output its batched decoder was last initialised for
/// (`nvjpegDecodeBatchedInitialize`): initialised again only when either changes or a batch
/// failed, as nvjpeg.h advises, not before every batch (on an H100 that trained ResNet-50 on
/// GPU-decoded JPEGs about 2.5 % faster, 2026-12-06).
struct State {
    raw: RawState,
    ready_for: Option<(c_int, c_int)>,
}

/// nvJPEG's `nvjpegImage_t`: up to four planes, each an address and a row pitch in bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Image {
    channel: [*mut u8; 4],
    pitch: [usize; 4],
}

/// `nvjpegBackend_t` values.
const BACKEND_DEFAULT: c_int = 0;
const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_OUTPUT_YUV`: the Y, Cb and Cr planes at their coded sizes.
const OUTPUT_YUV: c_int = 1;
/// `NVJPEG_OUTPUT_RGBI`: one plane of interleaved R, G, B bytes.
const OUTPUT_RGBI: c_int = 5;

type CreateEx = unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut RawHandle) -> c_int;
type StateCreate = unsafe extern "C" fn(RawHandle, *mut RawState) -> c_int;
type BatchedInitialize = unsafe extern "C" fn(RawHandle, RawState, c_int, c_int, c_int) -> c_int;
type DecodeBatched =
    unsafe extern "C" fn(RawHandle, RawState, *const *const u8, *const usize, *mut Image, driver::CUstream) -> c_int;
/// `nvjpegGetHardwareDecoderInfo(handle, engines, cores per engine)`.
type HardwareInfo = unsafe extern "C" fn(RawHandle, *mut c_uint, *mut c_uint) -> c_int;

/// The entry points used, resolved once from libnvjpeg.
struct Api {
    create_ex: CreateEx,
    state_create: StateCreate,
    batched_initialize: BatchedInitialize,
    decode_batched: DecodeBatched,
    /// Absent from libraries older than CUDA 11.9.
    hardware_info: Option<HardwareInfo>,
    /// Kept loaded for the process's lifetime (the handles live as long).
    _lib: Library,
}

/// The names libnvjpeg goes by (CUDA 13, 12, 11, then the unversioned development link).
const LIBRARY_NAMES: [&str; 4] = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so.11", "libnvjpeg.so"];

fn api() -> std::result::Result<&'static Api, String> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: loading a shared library by name, and reading symbols whose C signatures are
        // the `Api` fields' types (nvjpeg.h, stable since CUDA 10).
        unsafe {
            let lib = LIBRARY_NAMES.iter().find_map(|name| Library::new(name).ok()).ok_or_else(|| {
                format!("libnvjpeg not found on the library path (tried {})", LIBRARY_NAMES.join(", "))
            })?;
            let missing = |e: libloading::Error| format!("libnvjpeg: {e}");
            Ok(Api {
                create_ex: *lib.get::<CreateEx>(b"nvjpegCreateEx\0").map_err(missing)?,
                state_create: *lib.get::<StateCreate>(b"nvjpegJpegStateCreate\0").map_err(missing)?,
                batched_initialize: *lib
                    .get::<BatchedInitialize>(b"nvjpegDecodeBatchedInitialize\0")
                    .map_err(missing)?,
                decode_batched: *lib.get::<DecodeBatched>(b"nvjpegDecodeBatched\0").map_err(missing)?,
                hardware_info: lib.get::<HardwareInfo>(b"nvjpegGetHardwareDecoderInfo\0").ok().map(|f| *f),
                _lib: lib,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn check(what: &'static str, status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    let name = match status {
        1 => "NOT_INITIALIZED",
        2 => "INVALID_PARAMETER",
        3 => "BAD_JPEG",
        4 => "JPEG_NOT_SUPPORTED",
        5 => "ALLOCATOR_FAILURE",
        6 => "EXECUTION_FAILED",
        7 => "ARCH_MISMATCH",
        8 => "INTERNAL_ERROR",
        9 => "IMPLEMENTATION_NOT_SUPPORTED",
        10 => "INCOMPLETE_BITSTREAM",
        _ => "unknown status",
    };
    Err(Error::Kernel { op: "nvJPEG", reason: format!("{what}: NVJPEG_STATUS_{name} ({status})") })
}

/// Which of nvJPEG's decoders runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The GPU's JPEG engines (A100, H100, H200 and later data-centre GPUs).
    Hardware,
    /// CUDA kernels, with Huffman decoding on the host thread that submits the batch.
    Default,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Hardware => "nvJPEG on the GPU's hardware JPEG decoder",
            Backend::Default => "nvJPEG's CUDA decoder (Huffman decoding on the host)",
        })
    }
}

/// Decode slots per device: the batch being read by the training stream and the next one,
/// decoded ahead.
const SLOTS: usize = 2;

/// How long a submission waits for a slot before it reports the decoder stuck (a batch taken
/// and never handed to the device, by a consumer that stopped without dropping it).
const SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// One of the decode slots that alternate: an nvJPEG state, the memory its images are decoded
/// into, and the events that order it between the decoder's stream and the reader's.
struct Slot {
    state: State,
    /// Recorded on the decoder's stream after the slot's last decode.
    decoded: driver::CUevent,
    /// Recorded on the reader's stream after the last reader of the slot's images.
    consumed: driver::CUevent,
    used: bool,
    /// The decoded images: an address and its size in bytes (0: none yet).
    scratch: (u64, usize),
    /// The encoded bytes of the slot's last decode, which nvJPEG may read until it has ended.
    held: Option<Box<dyn std::any::Any + Send>>,
}

/// nvJPEG's handle, the slots' states and memory, and the decoder's own stream: used by one
/// submitting thread at a time.
struct Decoder {
    handle: RawHandle,
    backend: Backend,
    slots: [Slot; SLOTS],
    next: usize,
    stream: Arc<CudaStream>,
}

// SAFETY: nvJPEG handles and states are plain heap objects, and events plain handles; a
// `Decoder` is used under its mutex, one thread at a time.
unsafe impl Send for Decoder {}

/// A device's JPEG decoder. A batch is submitted from any thread (the data loader's, ahead of
/// the step that reads it) into the next slot, once the batch that held that slot two
/// submissions back was read; the reads are enqueued on the training's stream, wherever that
/// is done ([`Submitted`]). Decoding runs on the decoder's own stream, so the JPEG engines work
/// on the next batch while the training stream computes on the current one.
pub(crate) struct DeviceJpeg {
    backend: Backend,
    decoder: Mutex<Decoder>,
    gate: SlotGate,
}

/// Which slots hold a batch not yet read (or dropped), and the wait for one to come free.
#[derive(Default)]
struct SlotGate {
    busy: Mutex<[bool; SLOTS]>,
    freed: Condvar,
}

impl SlotGate {
    /// Takes slot `index`, waiting up to `wait` for its batch to be read or dropped.
    fn acquire(&self, index: usize, wait: std::time::Duration) -> Result<()> {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let (mut busy, waited) =
            self.freed.wait_timeout_while(busy, wait, |b| b[index]).unwrap_or_else(|p| p.into_inner());
        if waited.timed_out() && busy[index] {
            return Err(Error::Kernel {
                op: "nvJPEG",
                reason: format!(
                    "no decode slot was freed in {:.0} s: a decoded batch was taken and never made into a tensor nor dropped",
                    wait.as_secs_f64()
                ),
            });
        }
        busy[index] = true;
        Ok(())
    }

    fn release(&self, index: usize) {
        self.busy.lock().unwrap_or_else(|p| p.into_inner())[index] = false;
        self.freed.notify_all();
    }
}

/// The device's decoder, created on first use (with the device's context bound by the caller).
pub(crate) fn device_jpeg(device: usize) -> Result<Arc<DeviceJpeg>> {
    static DECODERS: OnceLock<Mutex<HashMap<usize, Arc<DeviceJpeg>>>> = OnceLock::new();
    let mut map = DECODERS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&device) {
        return Ok(d.clone());
    }
    let decoder = Decoder::new(device)?;
    let made =
        Arc::new(DeviceJpeg { backend: decoder.backend, decoder: Mutex::new(decoder), gate: SlotGate::default() });
    map.insert(device, made.clone());
    Ok(made)
}

/// Where one image of a batch is decoded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// Interleaved R, G, B bytes: the first byte's address and the row pitch.
    Rgb { at: u64, pitch: u32 },
    /// JPEG's Y, Cb and Cr planes (addresses), the row pitches of Y and of both chroma planes,
    /// and how far chroma is halved across and down (0 or 1 each: 4:4:4, 4:2:2, 4:4:0, 4:2:0).
    YCbCr { planes: [u64; 3], pitch: [u32; 2], shift: [u8; 2] },
}

impl Decoded {
    fn offset(self, base: u64) -> Self {
        match self {
            Decoded::Rgb { at, pitch } => Decoded::Rgb { at: at + base, pitch },
            Decoded::YCbCr { planes, pitch, shift } => {
                Decoded::YCbCr { planes: planes.map(|p| p + base), pitch, shift }
            }
        }
    }
}

/// One image of a batch: compressed JPEG bytes for nvJPEG, or RGB bytes decoded elsewhere
/// (copied as they are), with the image's size.
pub(crate) struct Input<'a> {
    pub jpeg: bool,
    pub bytes: &'a [u8],
    pub width: u32,
    pub height: u32,
}

/// Where the submitting threads spent their time, summed over this process: batches
/// submitted, then nanoseconds waiting for a free slot (its batch not yet taken by a step),
/// waiting for the slot's previous decode and reads to end (the JPEG engines, the crop kernel),
/// and submitting: nvJPEG's calls, the headers' markers read for the planes' layout, the
/// copies of decoded pixels and the slot's memory when it grows (the host's own work).
static SUBMIT_TIMES: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
const BATCHES: usize = 0;
const SLOT_WAITED: usize = 1;
const REUSE_WAITED: usize = 2;
const SUBMITTING: usize = 3;

/// [`SUBMIT_TIMES`] as they stand: `[batches, slot wait ns, reuse wait ns, submit ns]`.
pub(crate) fn submit_times() -> [u64; 4] {
    SUBMIT_TIMES.each_ref().map(|t| t.load(Ordering::Relaxed))
}

fn add_time(which: usize, since: Instant) {
    SUBMIT_TIMES[which].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// Whether a slot's next decode waits on the host for the reads of its last batch (the
/// default); `BURN_DDP_DECODE_REUSE=device` (a diagnosis) orders it on the decoder's stream only.
fn reuse_waits_on_host() -> bool {
    static HOST: OnceLock<bool> = OnceLock::new();
    *HOST.get_or_init(|| std::env::var("BURN_DDP_DECODE_REUSE").map_or(true, |v| v != "device"))
}

/// Whether colour batches are decoded to their planes (`BURN_DDP_DECODE_OUTPUT=planes`: the
/// crop kernel's colour conversion instead of nvJPEG's); RGB otherwise (the default, also
/// `BURN_DDP_DECODE_OUTPUT=rgb`).
fn planes_asked() -> bool {
    static PLANES: OnceLock<bool> = OnceLock::new();
    *PLANES.get_or_init(|| std::env::var("BURN_DDP_DECODE_OUTPUT").is_ok_and(|v| v == "planes"))
}

fn driver_fail(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Kernel { op: "nvJPEG", reason: format!("{what}: {e:?}") }
}

/// Logs how many JPEG engines (and cores in each) the hardware decoder of `handle` has, where
/// libnvjpeg can say.
fn log_engines(api: &Api, handle: RawHandle) {
    let Some(info) = api.hardware_info else { return };
    let (mut engines, mut cores) = (0, 0);
    // SAFETY: a live handle; out-pointers to locals.
    if unsafe { info(handle, &mut engines, &mut cores) } == 0 {
        let each = if cores == 1 { "1 core".to_string() } else { format!("{cores} cores") };
        log::info!("nvJPEG: the GPU's hardware JPEG decoder has {engines} engines, {each} each");
    }
}

fn event() -> Result<driver::CUevent> {
    let mut event = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the caller bound the context.
    unsafe { driver::cuEventCreate(&mut event, driver::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
        .result()
        .map_err(|e| driver_fail("creating an event", e))?;
    Ok(event)
}

impl Decoder {
    fn new(device: usize) -> Result<Self> {
        let api = api().map_err(|reason| Error::Kernel { op: "nvJPEG", reason })?;
        let stream = crate::nn::cuda::cudnn::convolution::context(device)?
            .new_stream()
            .map_err(|e| driver_fail("creating the decoder's stream", e))?;
        let mut handle = std::ptr::null_mut();
        let none = std::ptr::null_mut();
        // SAFETY: default allocators (null), no flags, an out-pointer to a local.
        let backend = if unsafe { (api.create_ex)(BACKEND_HARDWARE, none, none, 0, &mut handle) } == 0 {
            Backend::Hardware
        } else {
            // SAFETY: as above.
            check("nvjpegCreateEx", unsafe { (api.create_ex)(BACKEND_DEFAULT, none, none, 0, &mut handle) })?;
            Backend::Default
        };
        if backend == Backend::Hardware {
            log_engines(api, handle);
        }
        let state = || -> Result<State> {
            let mut raw = std::ptr::null_mut();
            // SAFETY: a live handle; an out-pointer to a local.
            check("nvjpegJpegStateCreate", unsafe { (api.state_create)(handle, &mut raw) })?;
            Ok(State { raw, ready_for: None })
        };
        let slot = || -> Result<Slot> {
            Ok(Slot {
                state: state()?,
                decoded: event()?,
                consumed: event()?,
                used: false,
                scratch: (0, 0),
                held: None,
            })
        };
        Ok(Self { handle, backend, slots: [slot()?, slot()?], next: 0, stream })
    }

    /// Decodes (or copies) `inputs` into slot `index`'s memory on the decoder's stream, after
    /// the slot's previous decode and reads, and records the slot's `decoded` event. Returns
    /// where each image lies and how many JPEGs nvJPEG could not decode (their images are black).
    ///
    /// # Safety
    /// The device's context is bound on this thread; the slot is this caller's (acquired).
    unsafe fn decode_into(&mut self, index: usize, inputs: &[Input<'_>]) -> Result<(Vec<Decoded>, usize)> {
        let cu = self.stream.cu_stream();
        let slot = &mut self.slots[index];
        let waiting = Instant::now();
        if slot.used {
            // SAFETY: live events of the bound context. The slot's previous decode must be done
            // before its nvJPEG state is reused, and its images read before they are
            // overwritten. This thread waits for both (it is not the training's): an order on
            // the decoder's stream alone is not enough, as the JPEG engines wrote a slot whose
            // reader the stream still waited for.
            unsafe {
                driver::cuEventSynchronize(slot.decoded)
                    .result()
                    .map_err(|e| driver_fail("waiting for a decode", e))?;
                if reuse_waits_on_host() {
                    driver::cuEventSynchronize(slot.consumed)
                        .result()
                        .map_err(|e| driver_fail("waiting for a batch's reads", e))?;
                } else {
                    driver::cuStreamWaitEvent(cu, slot.consumed, 0)
                        .result()
                        .map_err(|e| driver_fail("ordering a decode", e))?;
                }
            }
        }
        add_time(REUSE_WAITED, waiting);
        let submitting = Instant::now();
        let shifts = if planes_asked() { planar_shifts(inputs) } else { None };
        let (layout, total) = layout(inputs, shifts.as_deref());
        if slot.scratch.1 < total {
            // Room to grow: a later batch of slightly larger images reuses it. The old memory
            // is freed in stream order, after its last reader.
            let bytes = total + total / 4;
            // SAFETY: the decoder's stream of the bound context; every byte an image occupies
            // is written (decoded or copied) before it is read.
            unsafe {
                if slot.scratch.1 > 0 {
                    cudarc::driver::result::free_async(slot.scratch.0, cu).map_err(|e| driver_fail("freeing", e))?;
                }
                slot.scratch = (0, 0);
                let at = cudarc::driver::result::malloc_async(cu, bytes)
                    .map_err(|e| driver_fail(&format!("allocating {bytes} bytes"), e))?;
                slot.scratch = (at, bytes);
            }
        }
        let planes: Vec<Decoded> = layout.iter().map(|d| d.offset(slot.scratch.0)).collect();
        for (input, plane) in inputs.iter().zip(&planes).filter(|(i, _)| !i.jpeg) {
            let Decoded::Rgb { at, .. } = *plane else { unreachable!("decoded pixels are laid out as RGB") };
            // SAFETY: the plane holds width·3·height bytes; the host bytes are read before this
            // returns (pageable memory: the driver stages them).
            unsafe { driver::cuMemcpyHtoDAsync_v2(at, input.bytes.as_ptr() as *const c_void, input.bytes.len(), cu) }
                .result()
                .map_err(|e| driver_fail("copying decoded pixels", e))?;
        }
        let jpegs: Vec<(usize, &Input<'_>)> = inputs.iter().enumerate().filter(|(_, i)| i.jpeg).collect();
        let output = if shifts.is_some() { OUTPUT_YUV } else { OUTPUT_RGBI };
        // SAFETY: the planes are the slot's memory, ordered on the decoder's stream.
        let failed = if jpegs.is_empty() {
            0
        } else {
            unsafe { decode_jpegs((self.handle, &mut slot.state), cu, &jpegs, &planes, output) }?
        };
        // SAFETY: a live event and stream of the bound context.
        unsafe { driver::cuEventRecord(slot.decoded, cu) }
            .result()
            .map_err(|e| driver_fail("recording an event", e))?;
        slot.used = true;
        add_time(SUBMITTING, submitting);
        Ok((planes, failed))
    }
}

impl DeviceJpeg {
    /// Which decoder runs.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// Decodes (or copies) the images `inputs` makes of `encoded` into device memory on the
    /// decoder's stream, into the next slot: first waits, on this thread, until the batch that
    /// slot held was read (or dropped). `encoded` is kept until this decode has ended.
    ///
    /// # Errors
    /// nvJPEG or the driver failing, or no slot freed within [`SLOT_WAIT`].
    ///
    /// # Safety
    /// The device's context is bound on this thread.
    pub(crate) unsafe fn submit<T: Send + 'static>(
        self: &Arc<Self>,
        encoded: T,
        inputs: impl FnOnce(&T) -> Vec<Input<'_>>,
    ) -> Result<Submitted> {
        let mut decoder = self.decoder.lock().unwrap_or_else(|p| p.into_inner());
        let index = decoder.next;
        let waiting = Instant::now();
        self.gate.acquire(index, SLOT_WAIT)?;
        add_time(SLOT_WAITED, waiting);
        SUBMIT_TIMES[BATCHES].fetch_add(1, Ordering::Relaxed);
        decoder.next = (index + 1) % SLOTS;
        let events = (decoder.slots[index].decoded, decoder.slots[index].consumed);
        // SAFETY: the context is bound (the caller's contract) and the slot acquired above.
        let decoded = unsafe { decoder.decode_into(index, &inputs(&encoded)) };
        decoder.slots[index].held = Some(Box::new(encoded));
        match decoded {
            Ok((planes, failed)) => {
                Ok(Submitted { jpeg: self.clone(), slot: index, planes, failed, decoded: events.0, consumed: events.1 })
            }
            Err(e) => {
                self.gate.release(index);
                Err(e)
            }
        }
    }
}

/// A batch submitted to a device's decoder: where its images lie once decoded. Its slot is
/// released by [`Submitted::consumed`] after the reads are enqueued, or when it is dropped
/// unread.
pub(crate) struct Submitted {
    jpeg: Arc<DeviceJpeg>,
    slot: usize,
    /// Where each image of the batch lies, in order.
    pub planes: Vec<Decoded>,
    /// JPEGs nvJPEG could not decode (their images are black).
    pub failed: usize,
    decoded: driver::CUevent,
    consumed: driver::CUevent,
}

// SAFETY: the events are plain handles, used by one thread at a time (whichever holds the
// batch); the slot is this value's until it is released.
unsafe impl Send for Submitted {}

impl Submitted {
    /// Makes `reader` wait for the batch's decode before the reads enqueued on it next.
    ///
    /// # Safety
    /// The device's context is bound on this thread; `reader` is a stream of it.
    pub(crate) unsafe fn wait_on(&self, reader: driver::CUstream) -> Result<()> {
        // SAFETY: a live event (recorded by `submit`) and the caller's stream.
        unsafe { driver::cuStreamWaitEvent(reader, self.decoded, 0) }
            .result()
            .map_err(|e| driver_fail("ordering the reads", e))
    }

    /// Marks the end of the batch's reads on `reader` and releases its slot: the images may be
    /// overwritten after those reads.
    ///
    /// # Safety
    /// The device's context is bound; `reader` is the stream the reads were enqueued on.
    pub(crate) unsafe fn consumed(self, reader: driver::CUstream) -> Result<()> {
        // SAFETY: a live event and stream of the bound context. The slot is released on drop.
        unsafe { driver::cuEventRecord(self.consumed, reader) }
            .result()
            .map_err(|e| driver_fail("recording an event", e))
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        self.jpeg.gate.release(self.slot);
    }
}

/// Decodes the JPEGs of a batch into their planes in one batched call, as `output`
/// (`OUTPUT_YUV` or `OUTPUT_RGBI`); when nvJPEG refuses the batch, image by image, blanking the
/// planes of the ones it refuses (black). Returns how many it refused.
///
/// # Safety
/// A live handle and state; planes of the bound context's memory, written on `cu`, laid out
/// for `output`.
unsafe fn decode_jpegs(
    (handle, state): (RawHandle, &mut State),
    cu: driver::CUstream,
    jpegs: &[(usize, &Input<'_>)],
    planes: &[Decoded],
    output: c_int,
) -> Result<usize> {
    let api = api().map_err(|reason| Error::Kernel { op: "nvJPEG", reason })?;
    let mut run = |items: &[(usize, &Input<'_>)]| -> c_int {
        let data: Vec<*const u8> = items.iter().map(|(_, i)| i.bytes.as_ptr()).collect();
        let lengths: Vec<usize> = items.iter().map(|(_, i)| i.bytes.len()).collect();
        let mut out: Vec<Image> = items.iter().map(|&(k, _)| image(planes[k])).collect();
        let wanted = (items.len() as c_int, output);
        // SAFETY: live handle and state; arrays of `items.len()` entries; planes sized for each
        // image in `output`'s form; a stream of the bound context.
        unsafe {
            if state.ready_for != Some(wanted) {
                state.ready_for = None;
                let status = (api.batched_initialize)(handle, state.raw, wanted.0, 1, output);
                if status != 0 {
                    return status;
                }
                state.ready_for = Some(wanted);
            }
            let status = (api.decode_batched)(handle, state.raw, data.as_ptr(), lengths.as_ptr(), out.as_mut_ptr(), cu);
            if status != 0 {
                // A failed batch leaves the batched decoder to be initialised again.
                state.ready_for = None;
            }
            status
        }
    };
    let mut failed = 0;
    if run(jpegs) != 0 {
        for one in jpegs {
            if run(std::slice::from_ref(one)) != 0 {
                failed += 1;
                // SAFETY: the image's planes, on the stream.
                unsafe { blank(planes[one.0], one.1.height, cu) }?;
            }
        }
    }
    Ok(failed)
}

/// nvJPEG's description of where to write an image.
fn image(plane: Decoded) -> Image {
    let none = std::ptr::null_mut();
    match plane {
        Decoded::Rgb { at, pitch } => {
            Image { channel: [at as *mut u8, none, none, none], pitch: [pitch as usize, 0, 0, 0] }
        }
        Decoded::YCbCr { planes: [y, cb, cr], pitch: [py, pc], .. } => Image {
            channel: [y as *mut u8, cb as *mut u8, cr as *mut u8, none],
            pitch: [py as usize, pc as usize, pc as usize, 0],
        },
    }
}

/// Makes an image of `height` rows black: RGB bytes 0, or Y 0 and chroma 128.
///
/// # Safety
/// The planes are live memory of the bound context, written on `cu`.
unsafe fn blank(plane: Decoded, height: u32, cu: driver::CUstream) -> Result<()> {
    let fill = |at: u64, value: u8, bytes: usize| {
        // SAFETY: the caller's planes, on the stream.
        unsafe { driver::cuMemsetD8Async(at, value, bytes, cu) }
            .result()
            .map_err(|e| driver_fail("clearing a failed image", e))
    };
    match plane {
        Decoded::Rgb { at, pitch } => fill(at, 0, pitch as usize * height as usize),
        Decoded::YCbCr { planes: [y, cb, cr], pitch: [py, pc], shift } => {
            let chroma_rows = height.div_ceil(1 << shift[1]) as usize;
            fill(y, 0, py as usize * height as usize)?;
            fill(cb, 128, pc as usize * chroma_rows)?;
            fill(cr, 128, pc as usize * chroma_rows)
        }
    }
}

/// For a batch whose every JPEG is a colour JPEG the crop kernel reads as planes (Y, Cb and Cr,
/// chroma halved or not each way: `nn::jpeg::device_decodable`, of the size the caller gave), each
/// image's chroma shifts (`None` for decoded pixels); `None` when any JPEG is another kind (the
/// batch is then decoded to RGB) or there is none. Reads only the headers' markers, on this thread.
fn planar_shifts(inputs: &[Input<'_>]) -> Option<Vec<Option<[u8; 2]>>> {
    let mut any = false;
    let shifts = inputs
        .iter()
        .map(|i| {
            if !i.jpeg {
                return Some(None);
            }
            any = true;
            let frame = crate::nn::jpeg::device_decodable(i.bytes)?;
            (frame.ycbcr && [frame.width, frame.height] == [i.width, i.height]).then_some(Some(frame.chroma_shift))
        })
        .collect::<Option<Vec<_>>>()?;
    any.then_some(shifts)
}

/// Each image's place in the scratch memory, relative to its start, and the bytes they all take.
/// Rows are rounded up to 256 bytes, heights to 16 rows (nvJPEG may write whole MCUs), and each
/// plane starts on a 256-byte boundary. An image with `shifts` is laid out as Y, Cb and Cr
/// planes; the others as interleaved RGB (rows of exactly `width·3` bytes for decoded pixels).
fn layout(inputs: &[Input<'_>], shifts: Option<&[Option<[u8; 2]>]>) -> (Vec<Decoded>, usize) {
    let mut at = 0usize;
    let mut take = |pitch: u32, rows: u32| {
        let this = at;
        at = (at + pitch as usize * rows.next_multiple_of(16) as usize).next_multiple_of(256);
        this as u64
    };
    let placed = inputs
        .iter()
        .enumerate()
        .map(|(k, i)| match shifts.and_then(|s| s[k]) {
            Some(shift) => {
                let (cw, ch) = (i.width.div_ceil(1 << shift[0]), i.height.div_ceil(1 << shift[1]));
                let pitch = [i.width.next_multiple_of(256), cw.next_multiple_of(256)];
                let planes = [take(pitch[0], i.height), take(pitch[1], ch), take(pitch[1], ch)];
                Decoded::YCbCr { planes, pitch, shift }
            }
            None => {
                let pitch = if i.jpeg { (i.width * 3).next_multiple_of(256) } else { i.width * 3 };
                Decoded::Rgb { at: take(pitch, i.height), pitch }
            }
        })
        .collect();
    (placed, at)
}

/// Whether libnvjpeg loads here, and which backend the device's decoder takes (created now,
/// with `device`'s context bound by the caller).
pub(crate) fn backend(device: usize) -> Result<Backend> {
    device_jpeg(device).map(|d| d.backend())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot is taken once until released; a waiting submission goes on when its slot is
    /// released by another thread, and reports a slot never released in one line.
    #[test]
    fn a_slot_waits_for_its_release_and_reports_one_never_released() {
        let gate = std::sync::Arc::new(SlotGate::default());
        let short = std::time::Duration::from_millis(30);
        gate.acquire(0, short).unwrap();
        gate.acquire(1, short).unwrap();
        let e = gate.acquire(0, short).unwrap_err().to_string();
        assert!(e.contains("no decode slot was freed") && e.lines().count() == 1, "{e}");
        let releaser = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                gate.release(0);
            })
        };
        let t = std::time::Instant::now();
        gate.acquire(0, std::time::Duration::from_secs(10)).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(90), "{:?}", t.elapsed());
        releaser.join().unwrap();
        let e = gate.acquire(1, short).unwrap_err().to_string();
        assert!(e.contains("never made into a tensor"), "{e}");
    }

    #[test]
    fn layout_aligns_images_and_leaves_room_for_whole_blocks() {
        let inputs = [
            Input { jpeg: true, bytes: &[], width: 500, height: 375 },
            Input { jpeg: false, bytes: &[], width: 7, height: 5 },
            Input { jpeg: true, bytes: &[], width: 1, height: 1 },
        ];
        let (l, total) = layout(&inputs, None);
        assert_eq!(l[0], Decoded::Rgb { at: 0, pitch: 1536 });
        assert_eq!(l[1], Decoded::Rgb { at: 1536 * 384, pitch: 21 });
        let third = (1536 * 384 + 21 * 16u64).next_multiple_of(256);
        assert_eq!(l[2], Decoded::Rgb { at: third, pitch: 256 });
        assert_eq!(total as u64, third + 256 * 16);
    }

    /// A 4:2:0 JPEG's planes: Y at full size, Cb and Cr at half each way (rounded up), each
    /// plane's rows rounded to 256 bytes and 16 rows; a 4:2:2 one beside it; decoded pixels
    /// stay RGB.
    #[test]
    fn planar_images_get_a_plane_per_component() {
        let inputs = [
            Input { jpeg: true, bytes: &[], width: 500, height: 375 },
            Input { jpeg: false, bytes: &[], width: 7, height: 5 },
            Input { jpeg: true, bytes: &[], width: 33, height: 17 },
        ];
        let (l, total) = layout(&inputs, Some(&[Some([1, 1]), None, Some([1, 0])]));
        let y = 512 * 384u64;
        let chroma = 256 * 192u64;
        assert_eq!(l[0], Decoded::YCbCr { planes: [0, y, y + chroma], pitch: [512, 256], shift: [1, 1] });
        let rgb = y + 2 * chroma;
        assert_eq!(l[1], Decoded::Rgb { at: rgb, pitch: 21 });
        let next = (rgb + 21 * 16).next_multiple_of(256);
        assert_eq!(
            l[2],
            Decoded::YCbCr { planes: [next, next + 256 * 32, next + 2 * 256 * 32], pitch: [256, 256], shift: [1, 0] }
        );
        assert_eq!(total as u64, next + 3 * 256 * 32);
    }
}

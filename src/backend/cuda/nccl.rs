//! NCCL as a [`Collective`] (`docs/distributed.md`): one communicator per GPU, made either for
//! every GPU of this process at once (one thread per GPU, [`NcclCollective::for_devices`]) or
//! once per process from a unique id that rank 0 hands out over the TCP rendezvous
//! ([`NcclCollective::from_launch`], torchrun-style variables). libnccl is loaded at run time,
//! so builds and CPU-only machines need none.
//!
//! The device-buffer operations are the real interface; the [`Collective`] methods on host
//! slices stage through a device buffer, because the layers still keep their tensors in host
//! memory. Never run yet: written and compiled on a machine without a GPU.
//!
//! NCCL reduces in its own order (ring or tree, chunked), not the CPU twin's rank order, so a
//! multi-GPU sum is deterministic for one topology and algorithm but not bit-equal to the CPU
//! group; a bf16 sum also rounds at every hop. World size 1 is the identity either way.

use std::sync::Mutex;
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use half::bf16;

use super::context::CudaDevice;
use super::error::CudaResultExt;
use crate::dist::collective::{Collective, Wire, check_gather, check_root};
use crate::dist::env::LaunchEnv;
use crate::dist::rendezvous::{RendezvousHost, join};
use crate::error::{Error, Result};

/// How long ranks wait for one another at the rendezvous.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether libnccl can be loaded (every NCCL call would panic inside cudarc without it).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen libnccl; no NCCL function is called.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn nccl_error(op: &'static str, rank: usize, e: impl std::fmt::Debug) -> Error {
    Error::Collective {
        op,
        rank,
        reason: format!("NCCL: {e:?}"),
    }
}

fn check_present(rank: usize) -> Result<()> {
    if nccl_present() {
        return Ok(());
    }
    Err(Error::Collective {
        op: "nccl_init",
        rank,
        reason: "libnccl (NCCL 2) is not installed or not on the library path".into(),
    })
}

/// A communicator that one thread at a time may use.
struct CommCell(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; the Mutex around every `CommCell` serializes them.
unsafe impl Send for CommCell {}

/// One rank of an NCCL group.
pub struct NcclCollective {
    rank: usize,
    world: usize,
    comm: Mutex<CommCell>,
}

/// A new NCCL unique id (rank 0 makes it; every rank needs the same one).
pub fn unique_id() -> Result<[u8; 128]> {
    check_present(0)?;
    let id = Id::new().map_err(|e| nccl_error("nccl_unique_id", 0, e))?;
    Ok(id.internal().map(|c| c as u8))
}

impl NcclCollective {
    /// Rank `rank` of `world_size` on `device`, joining the group named by `id`. Blocks until
    /// every rank has joined.
    pub fn from_id(device: &CudaDevice, rank: usize, world_size: usize, id: &[u8; 128]) -> Result<Self> {
        check_present(rank)?;
        let id = Id::uninit(id.map(|b| b as core::ffi::c_char));
        let comm = Comm::from_rank(device.stream().clone(), rank, world_size, id)
            .map_err(|e| nccl_error("nccl_init", rank, e))?;
        Ok(NcclCollective {
            rank,
            world: world_size,
            comm: Mutex::new(CommCell(comm)),
        })
    }

    /// This process's rank of a launch (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) on
    /// `device` (normally GPU `LOCAL_RANK`): rank 0 makes the unique id and hands it out over
    /// the TCP rendezvous, the others fetch it; then every rank joins.
    pub fn from_launch(env: &LaunchEnv, device: &CudaDevice) -> Result<Self> {
        check_present(env.rank)?;
        let id = if env.rank == 0 {
            let id = unique_id()?;
            let host = RendezvousHost::bind(&format!("0.0.0.0:{}", env.master_port))?;
            host.serve(env.world_size, &id, RENDEZVOUS_TIMEOUT)?;
            id
        } else {
            let bytes = join(&env.master(), env.rank, env.world_size, RENDEZVOUS_TIMEOUT)?;
            bytes.try_into().map_err(|b: Vec<u8>| Error::Collective {
                op: "rendezvous",
                rank: env.rank,
                reason: format!("rank 0 sent {} bytes, an NCCL id has 128", b.len()),
            })?
        };
        Self::from_id(device, env.rank, env.world_size, &id)
    }

    /// One rank per device of this process (rank `i` on `devices[i]`), for one thread per GPU.
    pub fn for_devices(devices: &[CudaDevice]) -> Result<Vec<Self>> {
        check_present(0)?;
        let streams = devices.iter().map(|d| d.stream().clone()).collect();
        let comms = Comm::from_devices(streams).map_err(|e| nccl_error("nccl_init", 0, e))?;
        let world = comms.len();
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| NcclCollective {
                rank,
                world,
                comm: Mutex::new(CommCell(comm)),
            })
            .collect())
    }

    fn with_comm<T>(&self, op: &'static str, f: impl FnOnce(&Comm) -> Result<T>) -> Result<T> {
        let cell = self.comm.lock().map_err(|_| Error::Collective {
            op,
            rank: self.rank,
            reason: "a thread panicked inside an NCCL call".into(),
        })?;
        f(&cell.0)
    }

    /// In-place sum over ranks of a device buffer (NCCL's order, see the module documentation).
    pub fn all_reduce_sum_device(&self, buffer: &mut CudaSlice<f32>) -> Result<()> {
        self.with_comm("all_reduce_sum", |c| {
            c.all_reduce_in_place(buffer, &ReduceOp::Sum)
                .map(drop)
                .map_err(|e| nccl_error("all_reduce_sum", self.rank, e))
        })
    }

    /// In-place bf16 sum over ranks of a device buffer (half the bytes of f32).
    pub fn all_reduce_sum_bf16_device(&self, buffer: &mut CudaSlice<bf16>) -> Result<()> {
        self.with_comm("all_reduce_sum", |c| {
            c.all_reduce_in_place(buffer, &ReduceOp::Sum)
                .map(drop)
                .map_err(|e| nccl_error("all_reduce_sum", self.rank, e))
        })
    }

    /// In-place max over ranks of a device buffer (the amaxes of a pass).
    pub fn all_reduce_max_device(&self, buffer: &mut CudaSlice<f32>) -> Result<()> {
        self.with_comm("all_reduce_max", |c| {
            c.all_reduce_in_place(buffer, &ReduceOp::Max)
                .map(drop)
                .map_err(|e| nccl_error("all_reduce_max", self.rank, e))
        })
    }

    /// `out` (`world_size` times `local`'s length) becomes every rank's `local`, in rank order.
    pub fn all_gather_device(&self, local: &CudaSlice<f32>, out: &mut CudaSlice<f32>) -> Result<()> {
        check_gather(self.rank, local.len(), out.len(), self.world)?;
        self.with_comm("all_gather", |c| {
            c.all_gather(local, out)
                .map(drop)
                .map_err(|e| nccl_error("all_gather", self.rank, e))
        })
    }

    /// In-place broadcast of `root`'s device buffer.
    pub fn broadcast_device(&self, buffer: &mut CudaSlice<f32>, root: usize) -> Result<()> {
        check_root("broadcast", self.rank, root, self.world)?;
        self.with_comm("broadcast", |c| {
            c.broadcast_in_place(buffer, root as i32)
                .map(drop)
                .map_err(|e| nccl_error("broadcast", self.rank, e))
        })
    }

    fn stream(&self) -> Result<std::sync::Arc<CudaStream>> {
        self.with_comm("stream", |c| Ok(c.stream()))
    }

    /// Copies `data` to the device, runs `op` on it, copies the result back.
    fn staged(&self, data: &mut [f32], op: impl FnOnce(&mut CudaSlice<f32>) -> Result<()>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let stream = self.stream()?;
        let mut buffer = stream.clone_htod(data).call("cuMemcpyHtoD")?;
        op(&mut buffer)?;
        stream.memcpy_dtoh(&buffer, data).call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, data: &mut [f32], wire: Wire) -> Result<()> {
        match wire {
            Wire::F32 => self.staged(data, |b| self.all_reduce_sum_device(b)),
            Wire::Bf16 => {
                if data.is_empty() {
                    return Ok(());
                }
                let stream = self.stream()?;
                let sent: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
                let mut buffer = stream.clone_htod(&sent).call("cuMemcpyHtoD")?;
                self.all_reduce_sum_bf16_device(&mut buffer)?;
                let summed = stream.clone_dtoh(&buffer).call("cuMemcpyDtoH")?;
                stream.synchronize().call("cuStreamSynchronize")?;
                data.iter_mut().zip(summed).for_each(|(d, s)| *d = s.to_f32());
                Ok(())
            }
        }
    }

    fn all_reduce_max(&self, data: &mut [f32]) -> Result<()> {
        self.staged(data, |b| self.all_reduce_max_device(b))
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.staged(data, |b| self.broadcast_device(b, root))
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        check_gather(self.rank, local.len(), out.len(), self.world)?;
        if local.is_empty() {
            return Ok(());
        }
        let stream = self.stream()?;
        let sent = stream.clone_htod(local).call("cuMemcpyHtoD")?;
        let mut gathered = stream.alloc_zeros::<f32>(out.len()).call("cuMemAlloc")?;
        self.all_gather_device(&sent, &mut gathered)?;
        stream.memcpy_dtoh(&gathered, out).call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")
    }

    fn barrier(&self) -> Result<()> {
        // NCCL has no barrier: a one-value all-reduce makes every rank wait for the others.
        self.all_reduce_sum(&mut [0.0], Wire::F32)
    }
}

//! The few bpf(2) commands the relay needs, over `libc::syscall` (no BPF library: five
//! commands and four attribute layouts, from linux/bpf.h).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

const MAP_CREATE: libc::c_long = 0;
const MAP_UPDATE_ELEM: libc::c_long = 2;
const MAP_DELETE_ELEM: libc::c_long = 3;
const PROG_LOAD: libc::c_long = 5;
const PROG_ATTACH: libc::c_long = 8;
const OBJ_GET_INFO_BY_FD: libc::c_long = 15;

const MAP_TYPE_SOCKHASH: u32 = 18;
const PROG_TYPE_SK_SKB: u32 = 14;
const SK_SKB_STREAM_VERDICT: u32 = 5;
/// `BPF_ANY`: create or replace.
const ANY: u64 = 0;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE`.
#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// For `BPF_PROG_LOAD`.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// For `BPF_MAP_UPDATE_ELEM` and `BPF_MAP_DELETE_ELEM`.
#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// For `BPF_PROG_ATTACH`.
#[repr(C)]
#[derive(Default)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// For `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Default)]
struct GetInfo {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The leading fields of `struct bpf_map_info`.
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
}

/// bpf(2) with `attr`; its answer (a descriptor or 0) or the error.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialized `#[repr(C)]` value whose layout is the leading
    // part of `union bpf_attr` for `cmd` (the kernel reads `size` bytes and treats the
    // rest of its union as zero); it is borrowed mutably for the call, so the kernel's
    // writes (none for these commands, except through the pointers they carry) cannot
    // alias anything else. Every pointer inside it points to memory that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A descriptor the kernel returned.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: `fd` was just returned by bpf(2) as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A sockhash of `max_entries` sockets keyed by a `u64` (a socket cookie).
pub fn create_sockhash(max_entries: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreate {
        map_type: MAP_TYPE_SOCKHASH,
        key_size: 8,
        value_size: 4,
        max_entries,
        ..Default::default()
    };
    attr.map_name[..8].copy_from_slice(b"holdfast");
    owned(bpf(MAP_CREATE, &mut attr)?)
}

/// Loads an `sk_skb` program; the verifier's log in the error when it refuses it.
pub fn load_sk_skb(insns: &[crate::program::Insn]) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = ProgLoad {
        prog_type: PROG_TYPE_SK_SKB,
        insn_cnt: u32::try_from(insns.len()).map_err(|_| io::Error::other("program too long"))?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        ..Default::default()
    };
    attr.prog_name[..8].copy_from_slice(b"holdfast");
    match bpf(PROG_LOAD, &mut attr) {
        Ok(fd) => owned(fd),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let verifier = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(
                e.kind(),
                format!("{e}; the verifier said: {}", verifier.trim()),
            ))
        }
    }
}

/// Attaches `prog` to `map` as its stream verdict program.
pub fn attach_verdict(map: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = ProgAttach {
        target_fd: map.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: SK_SKB_STREAM_VERDICT,
        attach_flags: 0,
    };
    bpf(PROG_ATTACH, &mut attr).map(drop)
}

/// Puts socket `value` in `map` under `key`.
pub fn update(map: BorrowedFd<'_>, key: u64, value: BorrowedFd<'_>) -> io::Result<()> {
    let fd: u32 = value.as_raw_fd() as u32;
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const u64 as u64,
        value: &fd as *const u32 as u64,
        flags: ANY,
        ..Default::default()
    };
    bpf(MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Takes `key` out of `map` (`NotFound` when it was not there).
pub fn delete(map: BorrowedFd<'_>, key: u64) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const u64 as u64,
        ..Default::default()
    };
    bpf(MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// The kernel's id of the map behind `map` (the same for every descriptor of it, in any
/// process).
pub fn map_id(map: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = MapInfo::default();
    let mut attr = GetInfo {
        bpf_fd: map.as_raw_fd() as u32,
        info_len: std::mem::size_of::<MapInfo>() as u32,
        info: &mut info as *mut MapInfo as u64,
    };
    bpf(OBJ_GET_INFO_BY_FD, &mut attr)?;
    if info.map_type != MAP_TYPE_SOCKHASH {
        return Err(io::Error::other(format!(
            "map type {} is not a sockhash",
            info.map_type
        )));
    }
    Ok(info.id)
}

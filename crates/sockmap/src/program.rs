//! The verdict program, as eBPF instructions assembled here (twelve of them: no compiler,
//! no object file).
//!
//! For every chunk of bytes that arrives on a socket in the map, it looks up the socket's
//! own cookie in the map, whose value there is the socket's partner, and redirects the
//! bytes to the partner's send side. It always answers `SK_PASS`: when the lookup fails
//! (the pair is being taken out of the map) the bytes stay with the socket they arrived
//! on, for user space to read, instead of being dropped.

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    /// `dst_reg` in the low four bits, `src_reg` in the high four.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

// Opcodes (linux/bpf_common.h, linux/bpf.h).
/// `dst = src` (64 bit).
const MOV64_REG: u8 = 0xbf;
/// `dst = imm` (64 bit).
const MOV64_IMM: u8 = 0xb7;
/// `dst += imm` (64 bit).
const ADD64_IMM: u8 = 0x07;
/// `*(u64 *)(dst + off) = src`.
const STX_DW: u8 = 0x7b;
/// `dst = imm64` (two instructions); with `src = BPF_PSEUDO_MAP_FD` the immediate is a
/// map's file descriptor, which the kernel replaces with the map.
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

// Helpers (enum bpf_func_id).
const GET_SOCKET_COOKIE: i32 = 46;
const SK_REDIRECT_HASH: i32 = 72;

/// `SK_PASS`.
const SK_PASS: i32 = 1;

/// The program for the sockhash whose descriptor is `map_fd`.
pub fn redirect_to_partner(map_fd: i32) -> [Insn; 12] {
    [
        // r6 = skb (r1 is the context; helpers clobber r1-r5)
        insn(MOV64_REG, 6, 1, 0, 0),
        // r0 = bpf_get_socket_cookie(skb)
        insn(CALL, 0, 0, 0, GET_SOCKET_COOKIE),
        // the key, on the stack: *(u64 *)(r10 - 8) = r0
        insn(STX_DW, 10, 0, -8, 0),
        // bpf_sk_redirect_hash(skb, map, &key, 0): to the partner's send side
        insn(MOV64_REG, 1, 6, 0, 0),
        insn(LD_IMM64, 2, PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_REG, 3, 10, 0, 0),
        insn(ADD64_IMM, 3, 0, 0, -8),
        insn(MOV64_IMM, 4, 0, 0, 0),
        insn(CALL, 0, 0, 0, SK_REDIRECT_HASH),
        // SK_PASS whatever the redirect said (see the module documentation)
        insn(MOV64_IMM, 0, 0, 0, SK_PASS),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        let p = redirect_to_partner(7);
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        // r6 = r1: dst 6 in the low nibble, src 1 in the high one.
        assert_eq!(p[0].regs, 0x16);
        // The map's descriptor rides in the first half of the 64-bit load.
        assert_eq!((p[4].code, p[4].regs, p[4].imm), (LD_IMM64, 0x12, 7));
        assert_eq!(p[5], insn(0, 0, 0, 0, 0));
        assert_eq!(p[11].code, EXIT);
    }
}

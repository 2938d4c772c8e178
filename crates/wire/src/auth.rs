//! `mysql_native_password` arithmetic.
//!
//! The server stores `SHA1(SHA1(password))`; a client proves it knows the password by sending
//! `SHA1(password) XOR SHA1(scramble || SHA1(SHA1(password)))`. Knowing the stored value and
//! the scramble, holdfast recovers `SHA1(password)` from a correct answer, which is all it needs
//! to answer any other server's scramble later. The password itself is never seen.

use sha1::{Digest, Sha1};
use zeroize::{Zeroize, ZeroizeOnDrop};

pub const NATIVE_PASSWORD: &str = "mysql_native_password";
pub const SCRAMBLE_LEN: usize = 20;

/// `SHA1(password)`: a login secret. Zeroized on drop; its Debug output is redacted.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct PasswordHash([u8; 20]);

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PasswordHash(<redacted>)")
    }
}

impl PasswordHash {
    pub fn from_password(password: &[u8]) -> Self {
        PasswordHash(Sha1::digest(password).into())
    }

    /// The hash itself, for handing a session to the holdfast process that replaces this
    /// one (the caller zeroizes what it copies it into).
    pub fn to_bytes(&self) -> [u8; 20] {
        self.0
    }

    pub fn from_bytes(hash: [u8; 20]) -> Self {
        PasswordHash(hash)
    }

    /// The verifier a server stores for this password.
    pub fn verifier(&self) -> [u8; 20] {
        Sha1::digest(self.0).into()
    }

    /// The answer to `scramble` (only the first 20 bytes of a scramble count).
    pub fn scramble_response(&self, scramble: &[u8]) -> [u8; 20] {
        let stage2 = self.verifier();
        let mut h = Sha1::new();
        h.update(&scramble[..scramble.len().min(SCRAMBLE_LEN)]);
        h.update(stage2);
        let mask: [u8; 20] = h.finalize().into();
        let mut out = [0u8; 20];
        for i in 0..20 {
            out[i] = self.0[i] ^ mask[i];
        }
        out
    }
}

/// Checks a client's answer against a stored verifier; on success returns `SHA1(password)`.
pub fn verify_native(
    response: &[u8],
    scramble: &[u8],
    verifier: &[u8; 20],
) -> Option<PasswordHash> {
    if response.len() != 20 {
        return None;
    }
    let mut h = Sha1::new();
    h.update(&scramble[..scramble.len().min(SCRAMBLE_LEN)]);
    h.update(verifier);
    let mask: [u8; 20] = h.finalize().into();
    let mut candidate = [0u8; 20];
    for i in 0..20 {
        candidate[i] = response[i] ^ mask[i];
    }
    let candidate = PasswordHash(candidate);
    let check: [u8; 20] = Sha1::digest(candidate.0).into();
    // Not constant-time across the whole comparison would leak little (the attacker controls
    // the scramble only through reconnects), but fold it anyway.
    let diff = check
        .iter()
        .zip(verifier)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    (diff == 0).then_some(candidate)
}

/// Parses a stored `*<40 hex digits>` verifier.
pub fn parse_native_verifier(stored: &str) -> Option<[u8; 20]> {
    let hex = stored.strip_prefix('*')?;
    if hex.len() != 40 {
        return None;
    }
    let mut out = [0u8; 20];
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Maps random bytes onto printable ASCII, as servers do, so a scramble never holds a NUL.
pub fn printable_scramble(mut raw: [u8; SCRAMBLE_LEN]) -> [u8; SCRAMBLE_LEN] {
    for b in raw.iter_mut() {
        *b = 0x21 + (*b % 94);
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_recovers_hash() {
        let pw = PasswordHash::from_password(b"app_pass");
        let verifier = pw.verifier();
        let scramble = printable_scramble([9u8; 20]);
        let resp = pw.scramble_response(&scramble);
        let got = verify_native(&resp, &scramble, &verifier).unwrap();
        assert_eq!(got, pw);
        let mut bad = resp;
        bad[0] ^= 1;
        assert!(verify_native(&bad, &scramble, &verifier).is_none());
        assert!(verify_native(&resp[..19], &scramble, &verifier).is_none());
    }

    #[test]
    fn known_verifier_format() {
        // PASSWORD('app_pass') as MariaDB prints it is "*" + hex(SHA1(SHA1(pw))).
        let pw = PasswordHash::from_password(b"app_pass");
        let hex: String = pw.verifier().iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(
            parse_native_verifier(&format!("*{hex}")),
            Some(pw.verifier())
        );
        assert_eq!(parse_native_verifier("*12"), None);
        assert_eq!(parse_native_verifier(""), None);
    }

    #[test]
    fn debug_is_redacted() {
        let pw = PasswordHash::from_password(b"secret");
        assert_eq!(format!("{pw:?}"), "PasswordHash(<redacted>)");
    }
}

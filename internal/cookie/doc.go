// Package cookie is the headend's defence against handshake floods (the idea of
// WireGuard's cookie reply, in aggd's wire format: docs/wire-format.md, "Handshake
// floods").
//
// An INIT costs the headend's responder two Curve25519 operations. Anyone who has the
// headend's public key (every CPE's config does) can make INITs that pass the mac check,
// from any source address, faster than a responder can refuse them, and so crowd the
// CPEs out of the handshake rate limit. Once that limit is spent, the headend answers an
// INIT with a COOKIE_REPLY: a cookie bound to the INIT's source address and port, which
// costs it one BLAKE2s and one XChaCha20-Poly1305 seal, and is smaller than the INIT (no
// amplification). The CPE sends the INIT again with a mac2 made with that cookie, and the
// headend answers such INITs on a per-source limit instead of the shared one. A sender
// that forges its source address never sees the cookie; one that does not is limited
// like a single source.
//
//   - cookie = BLAKE2s-128(key: a random 32-byte secret, replaced every SecretLifetime;
//     message: the source address as 16 bytes (IPv4 mapped) || the port, big-endian).
//   - mac2 = BLAKE2s-128(key: cookie; message: the INIT's header bytes 0–19 || its body
//     up to the mac2). The header's tag (mac1) then covers the mac2.
//   - The reply seals the cookie with XChaCha20-Poly1305 under
//     BLAKE2s-256("aggd-cookie-v1" || headend public key), a random nonce, and the INIT's
//     ephemeral key as additional data: only someone who saw the INIT and knows the
//     headend's public key can make a reply the CPE accepts.
package cookie

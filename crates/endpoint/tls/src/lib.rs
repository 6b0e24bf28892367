//! NVMe/TCP TLS 1.3 with an external pre-shared key (NVMe/TCP transport
//! specification §3.6), over OpenSSL, for both ends: the target's reactors
//! and the host library.
//!
//! - PSKs: [`ServerConfig`] finds the TLS PSK for the identity a ClientHello
//!   offers through a lookup the caller gives (the target derives it from
//!   its configured keys, `trellis_nvme::tls_psk`); [`ClientConfig`] offers
//!   one identity and its PSK. TLS 1.3 only, cipher suites
//!   TLS_AES_128_GCM_SHA256 and TLS_AES_256_GCM_SHA384, the PSK bound to
//!   the suite of its hash (OpenSSL's `SSL_CTX_set_psk_find_session_callback`
//!   / `SSL_set_psk_use_session_callback`, which the openssl crate does not
//!   wrap: declared here). No certificates, no session tickets.
//! - Records: [`Tls`] is sans-IO. Ciphertext from the socket goes into
//!   [`Tls::cipher_in_space`]; [`Tls::read`] gives plaintext; plaintext
//!   goes in through [`Tls::write`]; ciphertext for the socket comes out of
//!   [`Tls::send_buf`]. No kTLS: record protection runs in user space (the
//!   machine this was built on has no `tls` module).
//!
//! Nothing here panics on peer input: every OpenSSL failure is an `Err`
//! naming what failed, and the callbacks catch panics before they reach C.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use foreign_types::ForeignTypeRef;
use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef, SslStream,
    SslVersion,
};
use std::io::{Read, Write};
use std::os::raw::{c_int, c_uchar};
use std::sync::{Arc, OnceLock};
pub use trellis_nvme::tls_psk::{Identity, PskHash};

/// Both suites NVMe/TCP names, in OpenSSL's TLS 1.3 cipher suite syntax.
pub const CIPHER_SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";
/// Room for received ciphertext: a few full records (16 KiB + 256 each).
pub const CIPHER_IN_BYTES: usize = 80 << 10;
/// Encrypted output is produced only while less than this waits for the
/// socket ([`Tls::out_room`]): bounds a connection's ciphertext buffers.
pub const CIPHER_OUT_BYTES: usize = 512 << 10;
/// Hard limit on ciphertext OpenSSL may leave waiting in one connection's
/// output. Our own writes stay under [`CIPHER_OUT_BYTES`] (plus record
/// overhead) through [`Tls::out_room`]; what OpenSSL writes on its own while
/// reading (a KeyUpdate answer to each KeyUpdate the peer requests) has no
/// other bound, so a peer that floods requests and never reads fails its
/// connection here instead of growing it without end.
pub const CIPHER_OUT_HARD_BYTES: usize = CIPHER_OUT_BYTES + (64 << 10);
/// Plaintext pieces shorter than this are gathered into one record rather
/// than sent as one record each (a PDU header, a 4 KiB read's data).
const COALESCE_BYTES: usize = 16 << 10;

mod ffi {
    use std::os::raw::{c_int, c_uchar};
    pub type FindSessionCb = unsafe extern "C" fn(
        ssl: *mut openssl_sys::SSL,
        identity: *const c_uchar,
        identity_len: usize,
        sess: *mut *mut openssl_sys::SSL_SESSION,
    ) -> c_int;
    pub type UseSessionCb = unsafe extern "C" fn(
        ssl: *mut openssl_sys::SSL,
        md: *const openssl_sys::EVP_MD,
        id: *mut *const c_uchar,
        idlen: *mut usize,
        sess: *mut *mut openssl_sys::SSL_SESSION,
    ) -> c_int;
    extern "C" {
        pub fn SSL_CTX_set_psk_find_session_callback(
            ctx: *mut openssl_sys::SSL_CTX,
            cb: Option<FindSessionCb>,
        );
        pub fn SSL_set_psk_use_session_callback(
            ssl: *mut openssl_sys::SSL,
            cb: Option<UseSessionCb>,
        );
        pub fn SSL_SESSION_new() -> *mut openssl_sys::SSL_SESSION;
        pub fn SSL_SESSION_set1_master_key(
            sess: *mut openssl_sys::SSL_SESSION,
            key: *const c_uchar,
            len: usize,
        ) -> c_int;
        pub fn SSL_SESSION_set_cipher(
            sess: *mut openssl_sys::SSL_SESSION,
            cipher: *const openssl_sys::SSL_CIPHER,
        ) -> c_int;
        pub fn SSL_SESSION_set_protocol_version(
            sess: *mut openssl_sys::SSL_SESSION,
            version: c_int,
        ) -> c_int;
        pub fn SSL_CIPHER_find(
            ssl: *mut openssl_sys::SSL,
            ptr: *const c_uchar,
        ) -> *const openssl_sys::SSL_CIPHER;
    }
}

/// Why a TLS connection failed or could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("OpenSSL setup failed: {0}")]
    Setup(#[from] openssl::error::ErrorStack),
    #[error("the peer closed the TLS session (close_notify)")]
    Closed,
    /// The handshake failed: what OpenSSL said, and the PSK lookup's
    /// explanation when it refused the identity.
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
    #[error("TLS record error: {0}")]
    Record(String),
}

/// Resolves a ClientHello's PSK identity to its TLS PSK, or says why not
/// (that text ends up in the target's log line).
pub type PskLookup = dyn Fn(&[u8]) -> Result<(Identity, Vec<u8>), String> + Send + Sync;

/// What the server's callback found, kept on the connection.
#[derive(Default)]
struct Outcome {
    identity: Option<Identity>,
    refused: Option<String>,
    /// The hash the host bound its PSK with (its first binder's length), when
    /// the ClientHello offered one: the session is built for it.
    binder_hash: Option<PskHash>,
}

/// The client's PSK, kept on the connection for its callback.
struct ClientPsk {
    identity: Vec<u8>,
    psk: Vec<u8>,
    hash: PskHash,
}

fn ctx_lookup_index() -> Result<Index<SslContext, Arc<PskLookup>>, openssl::error::ErrorStack> {
    static I: OnceLock<Index<SslContext, Arc<PskLookup>>> = OnceLock::new();
    if let Some(i) = I.get() {
        return Ok(*i);
    }
    let i = SslContext::new_ex_index()?;
    Ok(*I.get_or_init(|| i))
}

fn outcome_index() -> Result<Index<Ssl, Outcome>, openssl::error::ErrorStack> {
    static I: OnceLock<Index<Ssl, Outcome>> = OnceLock::new();
    if let Some(i) = I.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index()?;
    Ok(*I.get_or_init(|| i))
}

fn client_index() -> Result<Index<Ssl, ClientPsk>, openssl::error::ErrorStack> {
    static I: OnceLock<Index<Ssl, ClientPsk>> = OnceLock::new();
    if let Some(i) = I.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index()?;
    Ok(*I.get_or_init(|| i))
}

/// TLS 1.3 only, both NVMe/TCP suites, no tickets (an external PSK needs
/// none, and a ticket would be output nobody asked for).
fn base_context(method: SslMethod) -> Result<SslContextBuilder, openssl::error::ErrorStack> {
    let mut b = SslContextBuilder::new(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(CIPHER_SUITES)?;
    b.set_options(SslOptions::NO_TICKET);
    b.set_num_tickets(0)?;
    Ok(b)
}

/// A TLS 1.3 session of `hash`'s suite with `key` as its PSK, for the PSK
/// callbacks. Null on failure (OpenSSL then proceeds without a PSK, and the
/// handshake fails: no certificate is configured).
///
/// # Safety
/// `ssl` is the live connection the callback was called for.
unsafe fn psk_session(
    ssl: *mut openssl_sys::SSL,
    hash: PskHash,
    key: &[u8],
) -> *mut openssl_sys::SSL_SESSION {
    let code = hash.cipher_suite_code();
    // SAFETY: `ssl` is live (caller); `code` is a live 2-byte array.
    let cipher = unsafe { ffi::SSL_CIPHER_find(ssl, code.as_ptr()) };
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: takes no arguments; the result is checked.
    let sess = unsafe { ffi::SSL_SESSION_new() };
    if sess.is_null() {
        return sess;
    }
    // SAFETY: `sess` is the session just created and owned here; `key` is a
    // live slice of `key.len()` bytes that OpenSSL copies; `cipher` came from
    // SSL_CIPHER_find and is static in OpenSSL.
    let ok = unsafe {
        ffi::SSL_SESSION_set1_master_key(sess, key.as_ptr(), key.len()) == 1
            && ffi::SSL_SESSION_set_cipher(sess, cipher) == 1
            && ffi::SSL_SESSION_set_protocol_version(sess, openssl_sys::TLS1_3_VERSION) == 1
    };
    if !ok {
        // SAFETY: `sess` is ours and referenced nowhere else.
        unsafe { openssl_sys::SSL_SESSION_free(sess) };
        return std::ptr::null_mut();
    }
    sess
}

/// Server side: looks the offered identity up and hands OpenSSL a session
/// carrying its PSK. Returns 1 (OpenSSL's "no error") with or without a
/// session: without one the handshake fails, which is how a refused
/// identity ends.
unsafe extern "C" fn find_session_cb(
    ssl: *mut openssl_sys::SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL passes the live connection and a writable out
        // pointer; `identity` points to `identity_len` bytes for the call.
        unsafe {
            *sess = std::ptr::null_mut();
            let id = if identity.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(identity, identity_len)
            };
            let ssl_ref = SslRef::from_ptr_mut(ssl);
            let Ok(li) = ctx_lookup_index() else { return 0 };
            let Some(lookup) = ssl_ref.ssl_context().ex_data(li).cloned() else {
                return 0;
            };
            let Ok(oi) = outcome_index() else { return 0 };
            let binder_hash = ssl_ref.ex_data(oi).and_then(|o| o.binder_hash);
            // OpenSSL may call this once per offered identity: what an earlier
            // one found must not stand for a later one.
            if let Some(o) = ssl_ref.ex_data_mut(oi) {
                o.identity = None;
            }
            match lookup(id) {
                Ok((identity, psk)) => {
                    // OpenSSL copies it into the session: ours is wiped here.
                    let psk = zeroize::Zeroizing::new(psk);
                    let s = psk_session(ssl, binder_hash.unwrap_or(identity.hash), &psk);
                    if let Some(o) = ssl_ref.ex_data_mut(oi) {
                        if s.is_null() {
                            o.refused = Some("OpenSSL could not build the PSK session".into());
                        } else {
                            o.identity = Some(identity);
                        }
                    }
                    *sess = s;
                }
                Err(why) => {
                    if let Some(o) = ssl_ref.ex_data_mut(oi) {
                        o.refused = Some(why);
                    }
                }
            }
            1
        }
    });
    r.unwrap_or(0)
}

/// Client side: offers our identity and PSK when OpenSSL asks (with `md`
/// null for the first ClientHello; with the chosen suite's digest after a
/// HelloRetryRequest, when a PSK of another hash must not be offered).
unsafe extern "C" fn use_session_cb(
    ssl: *mut openssl_sys::SSL,
    md: *const openssl_sys::EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL passes the live connection and writable out
        // pointers; the identity we point it to lives in the connection's
        // ex_data, which outlives the handshake.
        unsafe {
            *sess = std::ptr::null_mut();
            *id = std::ptr::null();
            *idlen = 0;
            let ssl_ref = SslRef::from_ptr_mut(ssl);
            let Ok(ci) = client_index() else { return 0 };
            let Some(c) = ssl_ref.ex_data(ci) else {
                return 0;
            };
            if !md.is_null() {
                let want = match c.hash {
                    PskHash::Sha256 => openssl_sys::EVP_sha256(),
                    PskHash::Sha384 => openssl_sys::EVP_sha384(),
                };
                if openssl_sys::EVP_MD_get_type(md) != openssl_sys::EVP_MD_get_type(want) {
                    return 1; // no PSK for this suite
                }
            }
            let s = psk_session(ssl, c.hash, &c.psk);
            if s.is_null() {
                return 0;
            }
            *sess = s;
            *id = c.identity.as_ptr();
            *idlen = c.identity.len();
            1
        }
    });
    r.unwrap_or(0)
}

/// TLS extension pre_shared_key (RFC 8446 §4.2.11).
const EXT_PRE_SHARED_KEY: u32 = 41;

/// The hash of the first PSK a ClientHello offers: the one its first binder
/// was computed with (32 bytes: SHA-256, 48: SHA-384), else the one its NVMe
/// identity names. The binder decides because that is the hash the host
/// actually bound the PSK to, and a server that assumes another can only fail
/// the handshake: Debian 13's tlshd (ktls-utils 1.0.0 on GnuTLS) binds every
/// PSK with SHA-256, also an `NVMe0R02` one, as GnuTLS does for PSK credentials
/// allocated without a MAC (ktls-utils passes the identity's hash only where
/// GnuTLS has `gnutls_psk_allocate_client_credentials2`).
fn offered_psk_hash(ssl: &SslRef) -> Option<PskHash> {
    let mut p: *const c_uchar = std::ptr::null();
    let mut len: usize = 0;
    // SAFETY: called from the client hello callback on a live connection;
    // OpenSSL points `p` at `len` bytes it owns for the callback's duration.
    let ok = unsafe {
        openssl_sys::SSL_client_hello_get0_ext(ssl.as_ptr(), EXT_PRE_SHARED_KEY, &mut p, &mut len)
    };
    if ok != 1 || p.is_null() {
        return None;
    }
    // SAFETY: as above: `len` readable bytes at `p`, copied out at once.
    let ext = unsafe { std::slice::from_raw_parts(p, len) };
    match first_binder_len(ext) {
        Some(32) => Some(PskHash::Sha256),
        Some(48) => Some(PskHash::Sha384),
        _ => first_identity(ext)
            .and_then(Identity::parse)
            .map(|i| i.hash),
    }
}

/// The length of the first binder of an OfferedPsks structure (after the
/// identities: u16 length of the binders, then u8 length and bytes of each).
fn first_binder_len(ext: &[u8]) -> Option<usize> {
    let ids_len = u16::from_be_bytes([*ext.first()?, *ext.get(1)?]) as usize;
    let binders = ext.get(2 + ids_len..)?;
    let _total = u16::from_be_bytes([*binders.first()?, *binders.get(1)?]);
    binders.get(2).map(|&n| n as usize)
}

/// The first identity of an OfferedPsks structure: u16 length of the
/// identities, then u16 length, identity, u32 ticket age for each.
fn first_identity(ext: &[u8]) -> Option<&[u8]> {
    let list_len = u16::from_be_bytes([*ext.first()?, *ext.get(1)?]) as usize;
    let list = ext.get(2..2 + list_len)?;
    let id_len = u16::from_be_bytes([*list.first()?, *list.get(1)?]) as usize;
    list.get(2..2 + id_len)
}

/// The target's TLS context: any identity its lookup resolves.
#[derive(Clone)]
pub struct ServerConfig {
    ctx: SslContext,
}

impl ServerConfig {
    pub fn new(lookup: Arc<PskLookup>) -> Result<ServerConfig, TlsError> {
        let mut b = base_context(SslMethod::tls_server())?;
        // External PSKs only: nothing is resumed from a session cache.
        b.set_session_cache_mode(openssl::ssl::SslSessionCacheMode::OFF);
        b.set_ex_data(ctx_lookup_index()?, lookup);
        // OpenSSL picks a TLS 1.3 suite before it looks at the PSK, and
        // ignores a PSK of another hash: offer the suite of the identity's
        // hash only (NVMe0R02 → TLS_AES_256_GCM_SHA384), so a host that lists
        // both suites in the usual order still gets its SHA-384 PSK used.
        b.set_client_hello_callback(|ssl, _alert| {
            if let Some(h) = offered_psk_hash(ssl) {
                let suite = h.cipher_suite();
                let offered = ssl
                    .client_hello_ciphers()
                    .is_some_and(|c| c.chunks_exact(2).any(|c| c == h.cipher_suite_code()));
                ssl.set_ciphersuites(suite)?;
                if let Ok(oi) = outcome_index() {
                    if let Some(o) = ssl.ex_data_mut(oi) {
                        o.binder_hash = Some(h);
                        if !offered {
                            o.refused = Some(format!(
                                "the host bound its PSK with {h:?} but does not offer {suite}, the only TLS 1.3 suite such a PSK can be used with (Debian 13's tlshd, ktls-utils 1.0, does this for SHA-384 keys: give that host a SHA-256 key, NVMeTLSkey-1:01:)"
                            ));
                        }
                    }
                }
            }
            Ok(openssl::ssl::ClientHelloResponse::SUCCESS)
        });
        // SAFETY: the context is live (owned by `b`); the callback is a
        // plain function that only reads the context's ex_data set above.
        unsafe {
            ffi::SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session_cb));
        }
        Ok(ServerConfig { ctx: b.build() })
    }
}

/// A host's TLS setup: one identity and its TLS PSK (already derived).
#[derive(Clone)]
pub struct ClientConfig {
    ctx: SslContext,
    identity: String,
    psk: Vec<u8>,
    hash: PskHash,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientConfig({:?}, {:?})", self.identity, self.hash)
    }
}

impl ClientConfig {
    /// `suites`: OpenSSL TLS 1.3 cipher suite list (None: both). A PSK is
    /// only used with a suite of its own hash.
    pub fn new(
        identity: String,
        psk: Vec<u8>,
        hash: PskHash,
        suites: Option<&str>,
    ) -> Result<ClientConfig, TlsError> {
        let mut b = base_context(SslMethod::tls_client())?;
        if let Some(s) = suites {
            b.set_ciphersuites(s)?;
        }
        Ok(ClientConfig {
            ctx: b.build(),
            identity,
            psk,
            hash,
        })
    }
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// The socket side of a session: ciphertext in (filled by the caller's
/// receives) and out (taken by the caller's sends). OpenSSL reads and
/// writes it through the openssl crate's stream BIO.
struct Wire {
    inb: Box<[u8]>,
    head: usize,
    tail: usize,
    out: Vec<u8>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.head == self.tail {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.tail - self.head);
        buf[..n].copy_from_slice(&self.inb[self.head..self.head + n]);
        self.head += n;
        Ok(n)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > CIPHER_OUT_HARD_BYTES {
            return Err(std::io::Error::other(format!(
                "more than {CIPHER_OUT_HARD_BYTES} bytes of TLS output waiting for the peer"
            )));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One TLS session, sans-IO (see the crate comment).
pub struct Tls {
    s: SslStream<Wire>,
    server: bool,
    done: bool,
    /// Ciphertext handed to the socket and not yet confirmed sent: stays
    /// put while an io_uring send points into it.
    sending: Vec<u8>,
    send_pos: usize,
    /// Small plaintext pieces gathered into one record.
    stage: Vec<u8>,
}

fn describe(e: &openssl::ssl::Error) -> String {
    match e.ssl_error() {
        Some(stack) => stack
            .errors()
            .iter()
            .map(|x| x.reason().unwrap_or("unknown").to_string())
            .collect::<Vec<_>>()
            .join("; "),
        None => match e.io_error() {
            Some(io) => io.to_string(),
            None => format!("{:?}", e.code()),
        },
    }
}

impl Tls {
    fn new(mut ssl: Ssl, server: bool) -> Result<Tls, TlsError> {
        if server {
            ssl.set_accept_state();
        } else {
            ssl.set_connect_state();
        }
        let wire = Wire {
            inb: vec![0u8; CIPHER_IN_BYTES].into_boxed_slice(),
            head: 0,
            tail: 0,
            out: Vec::new(),
        };
        let s = SslStream::new(ssl, wire)?;
        Ok(Tls {
            s,
            server,
            done: false,
            sending: Vec::new(),
            send_pos: 0,
            stage: Vec::with_capacity(COALESCE_BYTES),
        })
    }

    /// The target's end of a new connection.
    pub fn server(cfg: &ServerConfig) -> Result<Tls, TlsError> {
        let mut ssl = Ssl::new(&cfg.ctx)?;
        ssl.set_ex_data(outcome_index()?, Outcome::default());
        Tls::new(ssl, true)
    }

    /// A host's end: the handshake starts with the first [`Tls::handshake`].
    pub fn client(cfg: &ClientConfig) -> Result<Tls, TlsError> {
        let mut ssl = Ssl::new(&cfg.ctx)?;
        ssl.set_ex_data(
            client_index()?,
            ClientPsk {
                identity: cfg.identity.clone().into_bytes(),
                psk: cfg.psk.clone(),
                hash: cfg.hash,
            },
        );
        // SAFETY: the connection is live (owned by `ssl`); the callback
        // reads only the ex_data set above.
        unsafe { ffi::SSL_set_psk_use_session_callback(ssl.as_ptr(), Some(use_session_cb)) };
        Tls::new(ssl, false)
    }

    /// Free room for received ciphertext (empty when full: the caller
    /// stops receiving until plaintext is read out).
    pub fn cipher_in_space(&mut self) -> &mut [u8] {
        let w = self.s.get_mut();
        if w.head == w.tail {
            w.head = 0;
            w.tail = 0;
        } else if w.tail == w.inb.len() && w.head > 0 {
            w.inb.copy_within(w.head..w.tail, 0);
            w.tail -= w.head;
            w.head = 0;
        }
        &mut w.inb[w.tail..]
    }

    pub fn cipher_in_commit(&mut self, n: usize) {
        let w = self.s.get_mut();
        w.tail = (w.tail + n).min(w.inb.len());
    }

    /// Ciphertext received and not yet taken by OpenSSL, or plaintext
    /// OpenSSL holds: [`Tls::read`] has something to work on.
    pub fn has_input(&self) -> bool {
        let w = self.s.get_ref();
        w.head != w.tail || self.s.ssl().pending() > 0
    }

    pub fn is_established(&self) -> bool {
        self.done
    }

    /// Advances the handshake with what was received. Ok(true) once it is
    /// complete. Its output waits in [`Tls::send_buf`].
    pub fn handshake(&mut self) -> Result<bool, TlsError> {
        if self.done {
            return Ok(true);
        }
        match self.s.do_handshake() {
            Ok(()) => {
                self.done = true;
                Ok(true)
            }
            Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => {
                Ok(false)
            }
            Err(e) => {
                let mut why = describe(&e);
                if let Some(r) = self.refused() {
                    why = format!("{r} ({why})");
                }
                Err(TlsError::Handshake(why))
            }
        }
    }

    /// Why the server's PSK lookup refused the client's identity, if it did.
    pub fn refused(&self) -> Option<String> {
        let oi = outcome_index().ok()?;
        self.s.ssl().ex_data(oi)?.refused.clone()
    }

    /// Server: the identity whose PSK the handshake used.
    pub fn peer_identity(&self) -> Option<&Identity> {
        let oi = outcome_index().ok()?;
        self.s.ssl().ex_data(oi)?.identity.as_ref()
    }

    /// The negotiated cipher suite (IANA name), once established.
    pub fn cipher(&self) -> Option<&'static str> {
        self.s
            .ssl()
            .current_cipher()
            .map(|c| c.standard_name().unwrap_or(c.name()))
    }

    pub fn is_server(&self) -> bool {
        self.server
    }

    /// Plaintext into `buf`. Ok(0): nothing more until more ciphertext
    /// arrives. Err(Closed) after the peer's close_notify.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, TlsError> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.s.ssl_read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => {
                Ok(0)
            }
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Err(TlsError::Closed),
            Err(e) => Err(TlsError::Record(describe(&e))),
        }
    }

    /// Encrypts all of `buf` (the output side never blocks: it is memory).
    fn write_all(&mut self, mut buf: &[u8]) -> Result<(), TlsError> {
        while !buf.is_empty() {
            match self.s.ssl_write(buf) {
                Ok(n) => buf = &buf[n..],
                Err(e) => return Err(TlsError::Record(describe(&e))),
            }
        }
        Ok(())
    }

    /// Encrypts `pieces` in order as one stream: short pieces are gathered
    /// into records of up to 16 KiB, long ones go to OpenSSL as they are.
    pub fn write<'a>(
        &mut self,
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<(), TlsError> {
        for p in pieces {
            if p.len() >= COALESCE_BYTES {
                self.flush_stage()?;
                self.write_all(p)?;
                continue;
            }
            let mut p = p;
            while !p.is_empty() {
                let n = (COALESCE_BYTES - self.stage.len()).min(p.len());
                self.stage.extend_from_slice(&p[..n]);
                p = &p[n..];
                if self.stage.len() == COALESCE_BYTES {
                    self.flush_stage()?;
                }
            }
        }
        self.flush_stage()
    }

    fn flush_stage(&mut self) -> Result<(), TlsError> {
        if self.stage.is_empty() {
            return Ok(());
        }
        let stage = std::mem::take(&mut self.stage);
        let r = self.write_all(&stage);
        self.stage = stage;
        self.stage.clear();
        r
    }

    /// How much more plaintext may be encrypted before the ciphertext
    /// waiting for the socket reaches [`CIPHER_OUT_BYTES`].
    pub fn out_room(&self) -> usize {
        let waiting = self.s.get_ref().out.len() + (self.sending.len() - self.send_pos);
        CIPHER_OUT_BYTES.saturating_sub(waiting)
    }

    /// Ciphertext is waiting for the socket.
    pub fn has_output(&self) -> bool {
        self.send_pos < self.sending.len() || !self.s.get_ref().out.is_empty()
    }

    /// Ciphertext for the socket. It stays where it is until [`Tls::sent`]
    /// confirms all of it, so an asynchronous send may point into it.
    pub fn send_buf(&mut self) -> &[u8] {
        if self.send_pos == self.sending.len() {
            self.sending.clear();
            self.send_pos = 0;
            std::mem::swap(&mut self.sending, &mut self.s.get_mut().out);
        }
        &self.sending[self.send_pos..]
    }

    /// `n` bytes of [`Tls::send_buf`] went out.
    pub fn sent(&mut self, n: usize) {
        self.send_pos = (self.send_pos + n).min(self.sending.len());
    }

    /// Queues a close_notify (best effort; the caller then sends and closes).
    pub fn close_notify(&mut self) {
        if self.done {
            let _ = self.s.shutdown();
        }
    }
}

/// Drives a client handshake on a blocking-capable socket until it
/// completes or `deadline` passes: sends what OpenSSL produced, receives
/// what it waits for. For the host library's connect path.
pub fn client_handshake(
    tls: &mut Tls,
    sock: &std::net::TcpStream,
    deadline: std::time::Instant,
) -> Result<(), TlsError> {
    let mut sock = sock;
    loop {
        let done = tls.handshake()?;
        while tls.has_output() {
            let b = tls.send_buf();
            let n = sock
                .write(b)
                .map_err(|e| TlsError::Handshake(format!("send: {e}")))?;
            tls.sent(n);
        }
        if done {
            return Ok(());
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(TlsError::Handshake("timed out".into()));
        }
        sock.set_read_timeout(Some(deadline - now))
            .map_err(|e| TlsError::Handshake(format!("socket: {e}")))?;
        let space = tls.cipher_in_space();
        let n =
            match sock.read(space) {
                Ok(0) => return Err(TlsError::Handshake(
                    "the peer closed the connection during the handshake (wrong PSK or identity?)"
                        .into(),
                )),
                Ok(n) => n,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return Err(TlsError::Handshake("timed out".into()))
                }
                Err(e) => return Err(TlsError::Handshake(format!("recv: {e}"))),
            };
        tls.cipher_in_commit(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation};

    /// Moves ciphertext between two sessions until neither has output.
    fn pump(a: &mut Tls, b: &mut Tls) {
        fn one_way(x: &mut Tls, y: &mut Tls) -> bool {
            let mut moved = false;
            while x.has_output() {
                let out = x.send_buf().to_vec();
                let space = y.cipher_in_space();
                let n = out.len().min(space.len());
                space[..n].copy_from_slice(&out[..n]);
                y.cipher_in_commit(n);
                x.sent(n);
                if n == 0 {
                    break; // y's input is full: it must read first
                }
                moved = true;
                let _ = y.handshake();
            }
            moved
        }
        for _ in 0..16 {
            let moved = one_way(a, b) | one_way(b, a);
            let _ = a.handshake();
            let _ = b.handshake();
            if !moved {
                break;
            }
        }
    }

    fn server_for(key: ConfiguredPsk, host: &'static str, sub: &'static str) -> ServerConfig {
        let lookup = move |id: &[u8]| {
            let id = Identity::parse(id).ok_or("not an NVMe identity")?;
            if id.hostnqn != host || id.subnqn != sub {
                return Err(format!("no key for {} {}", id.hostnqn, id.subnqn));
            }
            let psk = key
                .tls_psk(&id, Derivation::Spec)
                .map_err(|e| e.to_string())?;
            Ok((id, psk))
        };
        ServerConfig::new(Arc::new(lookup)).unwrap()
    }

    fn client_for(key: &ConfiguredPsk, host: &str, sub: &str, version: u8) -> ClientConfig {
        let id = key.identity(version, host, sub, Derivation::Spec);
        let psk = key.tls_psk(&id, Derivation::Spec).unwrap();
        ClientConfig::new(id.format(), psk, id.hash, None).unwrap()
    }

    #[test]
    fn both_suites_handshake_and_carry_data() {
        for (len, hash, suite) in [
            (32, PskHash::Sha256, "TLS_AES_128_GCM_SHA256"),
            (48, PskHash::Sha384, "TLS_AES_256_GCM_SHA384"),
        ] {
            let key = ConfiguredPsk {
                key: vec![3; len],
                transform: Some(hash),
            };
            let srv = server_for(key.clone(), "h", "s");
            let mut s = Tls::server(&srv).unwrap();
            let mut c = Tls::client(&client_for(&key, "h", "s", 1)).unwrap();
            assert!(!c.handshake().unwrap());
            pump(&mut c, &mut s);
            assert!(c.is_established() && s.is_established(), "{suite}");
            assert_eq!(s.cipher(), Some(suite));
            assert_eq!(s.peer_identity().unwrap().hostnqn, "h");
            let big = vec![0x5a; 100_000];
            c.write([&b"hdr"[..], &big, b"tail"]).unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 7000];
            while c.has_output() || s.has_input() {
                pump(&mut c, &mut s);
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
            }
            assert_eq!(got.len(), 3 + big.len() + 4);
            assert_eq!(&got[..3], b"hdr");
            assert_eq!(&got[got.len() - 4..], b"tail");
        }
    }

    #[test]
    fn a_sha384_identity_bound_with_sha256_is_served_with_the_sha256_suite() {
        // What Debian 13's tlshd sends for an NVMe0R02 key: the identity names
        // SHA-384, the binder is SHA-256. The server follows the binder.
        let key = ConfiguredPsk {
            key: vec![7; 48],
            transform: Some(PskHash::Sha384),
        };
        let srv = server_for(key.clone(), "h", "s");
        let id = key.identity(0, "h", "s", Derivation::Spec);
        assert_eq!(id.hash, PskHash::Sha384);
        let psk = key.tls_psk(&id, Derivation::Spec).unwrap();
        let cli = ClientConfig::new(id.format(), psk, PskHash::Sha256, None).unwrap();
        let mut s = Tls::server(&srv).unwrap();
        let mut c = Tls::client(&cli).unwrap();
        let _ = c.handshake();
        pump(&mut c, &mut s);
        assert!(c.is_established() && s.is_established());
        assert_eq!(s.cipher(), Some("TLS_AES_128_GCM_SHA256"));
        assert_eq!(s.peer_identity().unwrap().hash, PskHash::Sha384);
    }

    #[test]
    fn a_psk_bound_with_sha256_but_offered_only_with_the_sha384_suite_is_refused_with_the_reason() {
        // Debian 13's tlshd with an NVMe0R02 key: SHA-256 binder, only
        // TLS_AES_256_GCM_SHA384 offered. No TLS 1.3 server can accept that; the
        // target's log says why and what to do.
        let key = ConfiguredPsk {
            key: vec![7; 48],
            transform: Some(PskHash::Sha384),
        };
        let srv = server_for(key.clone(), "h", "s");
        let id = key.identity(0, "h", "s", Derivation::Spec);
        let psk = key.tls_psk(&id, Derivation::Spec).unwrap();
        let cli = ClientConfig::new(
            id.format(),
            psk,
            PskHash::Sha256,
            Some("TLS_AES_256_GCM_SHA384"),
        )
        .unwrap();
        let mut s = Tls::server(&srv).unwrap();
        let mut c = Tls::client(&cli).unwrap();
        let _ = c.handshake();
        pump(&mut c, &mut s);
        assert!(!s.is_established());
        let e = s.handshake().unwrap_err().to_string();
        assert!(
            e.contains("does not offer TLS_AES_128_GCM_SHA256") && e.contains("NVMeTLSkey-1:01:"),
            "{e}"
        );
    }

    extern "C" {
        fn SSL_key_update(s: *mut openssl_sys::SSL, update_type: c_int) -> c_int;
    }

    #[test]
    fn a_peer_that_floods_key_update_requests_and_never_reads_fails_its_connection() {
        // Each KeyUpdate(update_requested) makes OpenSSL write a KeyUpdate back
        // while it reads: output no out_room() check sees. The peer never takes
        // the server's output; the server must fail the connection at the hard
        // limit rather than grow it.
        let key = ConfiguredPsk {
            key: vec![3; 32],
            transform: Some(PskHash::Sha256),
        };
        let srv = server_for(key.clone(), "h", "s");
        let mut s = Tls::server(&srv).unwrap();
        let mut c = Tls::client(&client_for(&key, "h", "s", 0)).unwrap();
        let _ = c.handshake();
        pump(&mut c, &mut s);
        assert!(c.is_established() && s.is_established());
        let mut buf = [0u8; 64];
        let mut failed = None;
        for _ in 0..100_000 {
            // SAFETY: the client's connection is live; 1 = SSL_KEY_UPDATE_REQUESTED.
            unsafe { SSL_key_update(c.s.ssl().as_ptr(), 1) };
            c.write([&b"x"[..]]).unwrap();
            // Client to server only: the server's output is never taken.
            while c.has_output() {
                let out = c.send_buf().to_vec();
                let space = s.cipher_in_space();
                let n = out.len().min(space.len());
                space[..n].copy_from_slice(&out[..n]);
                s.cipher_in_commit(n);
                c.sent(n);
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) => {
                            failed = Some(e.to_string());
                            break;
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            if failed.is_some() {
                break;
            }
        }
        let waiting = s.s.get_ref().out.len() + (s.sending.len() - s.send_pos);
        assert!(waiting <= CIPHER_OUT_HARD_BYTES, "{waiting} bytes waiting");
        let e = failed.expect("the server kept answering KeyUpdates without bound");
        assert!(e.contains("record"), "{e}");
    }

    #[test]
    fn the_first_binder_length_is_read_after_the_identities() {
        // identities: 11 bytes (one of "abc"); binders: 33 bytes (one of 32).
        let mut ext = vec![0, 9, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0];
        ext.extend_from_slice(&[0, 33, 32]);
        ext.extend_from_slice(&[0u8; 32]);
        assert_eq!(first_binder_len(&ext), Some(32));
        assert_eq!(first_binder_len(&ext[..12]), None);
        assert_eq!(first_binder_len(&[0, 9]), None);
    }

    #[test]
    fn first_identity_is_read_from_offered_psks() {
        let mut ext = vec![0, 11, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0];
        ext.extend_from_slice(&[0, 0]);
        assert_eq!(first_identity(&ext), Some(&b"abc"[..]));
        assert_eq!(first_identity(&ext[..5]), None);
        assert_eq!(first_identity(&[]), None);
        assert_eq!(first_identity(&[0, 2, 0, 9]), None);
    }

    #[test]
    fn wrong_psk_and_unknown_identity_fail_the_handshake() {
        let key = ConfiguredPsk {
            key: vec![1; 32],
            transform: Some(PskHash::Sha256),
        };
        let other = ConfiguredPsk {
            key: vec![2; 32],
            transform: Some(PskHash::Sha256),
        };
        let srv = server_for(key.clone(), "h", "s");
        // Same identity, another key: the binder does not verify.
        let mut s = Tls::server(&srv).unwrap();
        let mut c = Tls::client(&client_for(&other, "h", "s", 0)).unwrap();
        let _ = c.handshake();
        pump(&mut c, &mut s);
        assert!(!s.is_established());
        assert!(matches!(s.handshake(), Err(TlsError::Handshake(_))));
        // An identity the server has no key for: refused with the reason.
        let mut s = Tls::server(&srv).unwrap();
        let mut c = Tls::client(&client_for(&key, "x", "s", 0)).unwrap();
        let _ = c.handshake();
        pump(&mut c, &mut s);
        let e = s.handshake().unwrap_err().to_string();
        assert!(e.contains("no key for x s"), "{e}");
    }
}

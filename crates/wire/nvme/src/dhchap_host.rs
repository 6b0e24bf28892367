//! DH-HMAC-CHAP, host side (NVMe Base 2.0 §8.13.5): the messages a host
//! sends, computed from those it receives. Sans-IO: the caller moves the
//! bytes with Authentication Send/Receive; randomness comes in as a closure.
//! Used by our host library and, in tests, against the target's state machine.

use crate::auth::{failure, Challenge, Failure, Message, Negotiate, Reply};
use crate::dhchap::{self, DhGroup, DhKey, HashId, ResponseInput, Secret};

/// One host's authentication of one queue.
pub struct HostAuth {
    pub secret: Secret,
    /// Set: the host authenticates the controller too (bidirectional).
    pub ctrl_secret: Option<Secret>,
    pub hostnqn: String,
    pub subnqn: String,
    pub t_id: u16,
    /// What the host offers, in its order of preference.
    pub hashes: Vec<HashId>,
    pub dhgroups: Vec<DhGroup>,
    state: Option<Expect>,
}

/// What the host keeps between its Reply and the controller's Success1.
struct Expect {
    hash: HashId,
    c2: Vec<u8>,
    s2: u32,
    session_key: Option<Vec<u8>>,
}

/// Why authentication failed, as an AUTH_Failure explanation code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFailure {
    /// The controller sent AUTH_Failure1: the transaction is over.
    Controller(u8),
    /// The host refuses the controller's message: send [`HostAuth::failure2`].
    Host(u8),
}

impl HostAuth {
    pub fn new(secret: Secret, ctrl_secret: Option<Secret>, hostnqn: &str, subnqn: &str) -> Self {
        HostAuth {
            secret,
            ctrl_secret,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            t_id: 1,
            hashes: HashId::ALL.to_vec(),
            dhgroups: DhGroup::ALL.to_vec(),
            state: None,
        }
    }

    /// AUTH_Negotiate.
    pub fn negotiate(&self) -> Vec<u8> {
        Message::Negotiate(Negotiate {
            t_id: self.t_id,
            sc_c: 0,
            hash_ids: self.hashes.iter().map(|h| *h as u8).collect(),
            dh_ids: self.dhgroups.iter().map(|g| *g as u8).collect(),
        })
        .encode()
    }

    /// The Reply to the controller's Challenge (or the controller's
    /// Failure1 as an error).
    pub fn reply(
        &mut self,
        challenge: &[u8],
        rng: &mut dyn FnMut(&mut [u8]),
    ) -> Result<Vec<u8>, HostFailure> {
        let c = match Message::decode(challenge) {
            Ok(Message::Challenge(c)) => c,
            Ok(Message::Failure1(f)) => return Err(HostFailure::Controller(f.explanation)),
            _ => return Err(HostFailure::Host(failure::INCORRECT_MESSAGE)),
        };
        let (hash, group) = self.check_challenge(&c)?;
        let (dhv, session_key) = match group {
            DhGroup::Null => (Vec::new(), None),
            g => {
                let mut x = [0u8; dhchap::PRIVATE_KEY_LEN];
                rng(&mut x);
                let k = DhKey::new(g, &x).ok_or(HostFailure::Host(failure::DHGROUP_UNUSABLE))?;
                let ks = k
                    .shared_secret(&c.dhv)
                    .map_err(|_| HostFailure::Host(failure::DHGROUP_UNUSABLE))?;
                (k.public_value(), Some(ks))
            }
        };
        let key = self.secret.transformed(&self.hostnqn);
        let challenge = dhchap::challenge_for(hash, &c.c1, session_key.as_deref());
        let response = dhchap::host_response(&ResponseInput {
            hash,
            key: &key,
            challenge: &challenge,
            seqnum: c.seqnum,
            t_id: self.t_id,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        });
        let mut c2 = vec![0u8; hash.len_bytes()];
        let mut s2 = 0u32;
        if self.ctrl_secret.is_some() {
            rng(&mut c2);
            while s2 == 0 {
                let mut b = [0u8; 4];
                rng(&mut b);
                s2 = u32::from_le_bytes(b);
            }
        }
        let bidi = self.ctrl_secret.is_some();
        self.state = Some(Expect {
            hash,
            c2: c2.clone(),
            s2,
            session_key,
        });
        Ok(Message::Reply(Reply {
            t_id: self.t_id,
            response,
            c2: bidi.then_some(c2),
            seqnum: s2,
            dhv,
        })
        .encode())
    }

    fn check_challenge(&self, c: &Challenge) -> Result<(HashId, DhGroup), HostFailure> {
        let hash = HashId::from_id(c.hash_id)
            .filter(|h| self.hashes.contains(h))
            .ok_or(HostFailure::Host(failure::HASH_UNUSABLE))?;
        let group = DhGroup::from_id(c.dh_id)
            .filter(|g| self.dhgroups.contains(g))
            .ok_or(HostFailure::Host(failure::DHGROUP_UNUSABLE))?;
        if c.t_id != self.t_id || c.c1.len() != hash.len_bytes() {
            return Err(HostFailure::Host(failure::INCORRECT_PAYLOAD));
        }
        if c.dhv.len() != group.value_len_bytes() {
            return Err(HostFailure::Host(failure::INCORRECT_PAYLOAD));
        }
        Ok((hash, group))
    }

    /// Checks Success1; for bidirectional authentication verifies the
    /// controller's response and returns the Success2 to send.
    pub fn success1(&mut self, msg: &[u8]) -> Result<Option<Vec<u8>>, HostFailure> {
        let s = match Message::decode(msg) {
            Ok(Message::Success1(s)) => s,
            Ok(Message::Failure1(f)) => return Err(HostFailure::Controller(f.explanation)),
            _ => return Err(HostFailure::Host(failure::INCORRECT_MESSAGE)),
        };
        let st = self
            .state
            .take()
            .ok_or(HostFailure::Host(failure::INCORRECT_MESSAGE))?;
        let Some(ctrl) = &self.ctrl_secret else {
            return Ok(None);
        };
        let Some(r2) = s.response else {
            return Err(HostFailure::Host(failure::FAILED));
        };
        let key = ctrl.transformed(&self.subnqn);
        let challenge = dhchap::challenge_for(st.hash, &st.c2, st.session_key.as_deref());
        let want = dhchap::ctrl_response(&ResponseInput {
            hash: st.hash,
            key: &key,
            challenge: &challenge,
            seqnum: st.s2,
            t_id: self.t_id,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        });
        if !dhchap::same(&want, &r2) {
            return Err(HostFailure::Host(failure::FAILED));
        }
        Ok(Some(Message::Success2 { t_id: self.t_id }.encode()))
    }

    /// AUTH_Failure2 telling the controller why the host gave up.
    pub fn failure2(&self, why: HostFailure) -> Vec<u8> {
        Message::Failure2(Failure {
            t_id: self.t_id,
            reason: failure::REASON_FAILED,
            explanation: match why {
                HostFailure::Controller(e) | HostFailure::Host(e) => e,
            },
        })
        .encode()
    }
}

//! The MPS host's protocol: over its unix socket, one connection per request; the plugin writes
//! one JSON [`Request`] and shuts its writing half, the host answers one JSON [`Response`] and
//! closes. Pure: encoding, decoding and their limits.

use serde::{Deserialize, Serialize};

use crate::mps::daemon::DaemonProcess;
use crate::mps::launch::Launch;

/// The largest request or answer, in bytes (a spawn request is about 1 KiB; a list of 1000
/// daemons about 40 KiB).
pub const MAX_MESSAGE: usize = 256 * 1024;

/// What the plugin asks of the host (`{"op": "spawn", "launch": {…}}`, `{"op": "kill", "pid":
/// 4242}`, `{"op": "list"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum Request {
    /// Start the daemon `launch` describes, keep it as a child and reap it when it exits.
    Spawn {
        /// The process, as the plugin's own start would run it.
        launch: Launch,
    },
    /// Kill the process group of the host's daemon `pid` (SIGKILL: the daemon and its server).
    Kill {
        /// The daemon's pid, as [`Response::Spawned`] gave it.
        pid: u32,
    },
    /// The host's live daemons.
    List,
}

/// The host's answer (`{"result": "spawned", "daemon": {"pid": 4242, "start": 123456}}`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase", deny_unknown_fields)]
pub enum Response {
    /// The daemon runs and its pid file is written: its pid and start time (clock ticks since
    /// boot, `/proc/<pid>/stat` field 22).
    Spawned {
        /// The process.
        daemon: DaemonProcess,
    },
    /// The daemon's group was sent SIGKILL (`running`: it still ran; false: it had exited
    /// already and nothing was sent).
    Killed {
        /// The pid asked for.
        pid: u32,
        /// Whether it still ran.
        running: bool,
    },
    /// The daemons the host started that have not exited, by pid.
    Daemons {
        /// Their processes.
        daemons: Vec<DaemonProcess>,
    },
    /// The request failed: what is wrong, and what is valid.
    Error {
        /// The reason.
        message: String,
    },
}

/// Decodes a request (the bytes the plugin wrote before it shut its writing half).
///
/// # Errors
/// The bytes are longer than [`MAX_MESSAGE`] or no request; the text says what is valid.
pub fn decode_request(bytes: &[u8]) -> Result<Request, String> {
    decode(
        bytes,
        "request",
        r#"{"op": "spawn", "launch": {…}}, {"op": "kill", "pid": <pid>} or {"op": "list"}"#,
    )
}

/// Decodes an answer.
///
/// # Errors
/// The bytes are longer than [`MAX_MESSAGE`] or no answer.
pub fn decode_response(bytes: &[u8]) -> Result<Response, String> {
    decode(
        bytes,
        "answer",
        r#"{"result": "spawned" | "killed" | "daemons" | "error", …}"#,
    )
}

fn decode<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    what: &str,
    valid: &str,
) -> Result<T, String> {
    if bytes.len() > MAX_MESSAGE {
        return Err(format!(
            "the MPS host {what} is {} bytes, more than the {MAX_MESSAGE} allowed",
            bytes.len()
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| format!("no valid MPS host {what}: {e} (valid: {valid})"))
}

/// The JSON of a request or an answer.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Plain structs of strings, paths and integers: serializing them cannot fail.
    serde_json::to_vec(message).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn launch() -> Launch {
        Launch {
            program: PathBuf::from("/bin/mps"),
            args: vec!["-f".to_string()],
            env: vec![("CUDA_VISIBLE_DEVICES".to_string(), "MIG-1".to_string())],
            output: PathBuf::from("/s/mps/a/log/daemon.out"),
            pid_file: PathBuf::from("/s/mps/a/daemon.pid"),
            control_socket: PathBuf::from("/s/mps/a/pipe/control"),
            shm_over_dev_shm: None,
        }
    }

    #[test]
    fn requests_and_answers_have_these_wire_forms() {
        let spawn = Request::Spawn { launch: launch() };
        let json: serde_json::Value = serde_json::from_slice(&encode(&spawn)).unwrap();
        assert_eq!(json["op"], "spawn");
        assert_eq!(json["launch"]["pidFile"], "/s/mps/a/daemon.pid");
        assert_eq!(json["launch"]["env"][0][0], "CUDA_VISIBLE_DEVICES");
        assert_eq!(decode_request(&encode(&spawn)).unwrap(), spawn);
        assert_eq!(
            decode_request(br#"{"op": "kill", "pid": 42}"#).unwrap(),
            Request::Kill { pid: 42 }
        );
        assert_eq!(decode_request(br#"{"op": "list"}"#).unwrap(), Request::List);
        let spawned = Response::Spawned {
            daemon: DaemonProcess { pid: 42, start: 7 },
        };
        assert_eq!(
            String::from_utf8(encode(&spawned)).unwrap(),
            r#"{"result":"spawned","daemon":{"pid":42,"start":7}}"#
        );
        for r in [
            spawned,
            Response::Killed {
                pid: 42,
                running: false,
            },
            Response::Daemons { daemons: vec![] },
            Response::Error {
                message: "x".to_string(),
            },
        ] {
            assert_eq!(decode_response(&encode(&r)).unwrap(), r);
        }
    }

    #[test]
    fn a_bad_request_says_what_is_valid() {
        let e = decode_request(br#"{"op": "exec", "cmd": "sh"}"#).unwrap_err();
        assert!(e.contains("unknown variant `exec`"), "{e}");
        assert!(e.contains(r#"{"op": "list"}"#), "{e}");
        let e = decode_request(br#"{"op": "kill", "pid": 42, "signal": 9}"#).unwrap_err();
        assert!(e.contains("unknown field `signal`"), "{e}");
        let e = decode_request(br#"{"op": "spawn", "launch": {"#).unwrap_err();
        assert!(e.starts_with("no valid MPS host request"), "{e}");
        let e = decode_request(b"").unwrap_err();
        assert!(e.starts_with("no valid MPS host request"), "{e}");
    }

    #[test]
    fn a_message_over_the_limit_is_refused_before_it_is_parsed() {
        let big = vec![b' '; MAX_MESSAGE + 1];
        let e = decode_request(&big).unwrap_err();
        assert_eq!(
            e,
            format!(
                "the MPS host request is {} bytes, more than the {MAX_MESSAGE} allowed",
                MAX_MESSAGE + 1
            )
        );
        assert!(decode_response(&big).unwrap_err().contains("answer"));
    }
}

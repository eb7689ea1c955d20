//! The fenced register: a file on local disk, guarded by `flock(2)`, that
//! keeps the highest fencing token it accepted and refuses writes with a
//! smaller one, as a real fenced resource would.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use crate::clock::now_ns;

/// The register's answer to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// The write's place in the register's total order (1, 2, …).
    pub seq: u64,
    /// When it happened, taken while holding the flock.
    pub at: u64,
    /// The token was not smaller than the highest accepted one.
    pub accepted: bool,
    /// The highest token accepted before this write.
    pub highest: Option<u64>,
}

/// A fenced register shared by the processes of a run.
#[derive(Debug, Clone)]
pub struct FencedRegister {
    path: PathBuf,
}

impl FencedRegister {
    /// Create an empty register at `path` (replacing one there).
    pub fn create(path: &Path) -> io::Result<Self> {
        std::fs::write(path, record(0, None))?;
        Ok(Self::open(path))
    }

    /// A register created by [`create`](Self::create).
    pub fn open(path: &Path) -> Self {
        FencedRegister {
            path: path.to_path_buf(),
        }
    }

    /// Write with `token`: accepted unless a larger token was accepted
    /// before. A write without a token (a backend without fencing) is
    /// always accepted: nothing can check it.
    pub fn write(&self, token: Option<u64>) -> io::Result<WriteOutcome> {
        let mut file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        flock(&file, FlockOperation::LockExclusive)?;
        let at = now_ns();
        let (seq, highest) = read_state(&mut file)?;
        let accepted = match (token, highest) {
            (Some(t), Some(h)) => t >= h,
            _ => true,
        };
        let new_highest = match (accepted, token, highest) {
            (true, Some(t), Some(h)) => Some(t.max(h)),
            (true, Some(t), None) => Some(t),
            _ => highest,
        };
        let seq = seq + 1;
        // One write of a fixed-size record, in place: a writer killed at
        // any point leaves the old state or the new, never a torn one.
        file.write_all_at(record(seq, new_highest).as_bytes(), 0)?;
        // Closing the file releases the flock.
        Ok(WriteOutcome {
            seq,
            at,
            accepted,
            highest,
        })
    }

    /// The number of writes so far and the highest accepted token.
    pub fn state(&self) -> io::Result<(u64, Option<u64>)> {
        let mut file = File::open(&self.path)?;
        flock(&file, FlockOperation::LockShared)?;
        read_state(&mut file)
    }
}

/// The register's state as a fixed-size line (42 bytes).
fn record(seq: u64, highest: Option<u64>) -> String {
    let highest = highest.map_or_else(|| "-".to_string(), |h| h.to_string());
    format!("{seq:>20} {highest:>20}\n")
}

fn read_state(file: &mut File) -> io::Result<(u64, Option<u64>)> {
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("register reads {text:?}"),
        )
    };
    let mut parts = text.split_whitespace();
    let seq = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let highest = match parts.next() {
        Some("-") => None,
        Some(h) => Some(h.parse().map_err(|_| bad())?),
        None => return Err(bad()),
    };
    Ok((seq, highest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_tokens_are_refused_and_equal_ones_accepted() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let reg = FencedRegister::create(&dir.path().join("register"))?;
        assert!(reg.write(Some(5))?.accepted);
        assert!(reg.write(Some(5))?.accepted);
        let refused = reg.write(Some(4))?;
        assert!(!refused.accepted);
        assert_eq!((refused.seq, refused.highest), (3, Some(5)));
        assert!(reg.write(None)?.accepted);
        assert_eq!(reg.write(Some(9))?.highest, Some(5));
        assert_eq!(reg.state()?, (5, Some(9)));
        Ok(())
    }
}

//! The launch settings of one rank in the torchrun style: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT` (`docs/distributed.md`, Launching). A process started by
//! `torchrun`, `mpirun` with these exported, or a shell loop reads them here.

use crate::error::{Error, Result};

/// torchrun's default rendezvous port.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// One rank's place in a multi-process launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Ranks over all nodes.
    pub world_size: usize,
    /// Rank within this node: the GPU ordinal it uses.
    pub local_rank: usize,
    /// Host of rank 0's rendezvous listener.
    pub master_addr: String,
    /// Port of rank 0's rendezvous listener.
    pub master_port: u16,
}

fn bad(setting: &'static str, value: &str, reason: &str) -> Error {
    Error::InvalidSetting {
        setting,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn parse<T: std::str::FromStr>(setting: &'static str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| bad(setting, value, "expected a non-negative integer"))
}

impl LaunchEnv {
    /// Reads the process environment; `None` when neither `RANK` nor `WORLD_SIZE` is set
    /// (not launched as one rank of several).
    pub fn from_env() -> Result<Option<LaunchEnv>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`] over any variable lookup. `RANK` and `WORLD_SIZE` come together;
    /// `LOCAL_RANK` defaults to `RANK` (one node), `MASTER_ADDR` to `127.0.0.1`,
    /// `MASTER_PORT` to 29500 (torchrun's defaults).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
        let (rank, world) = match (get("RANK"), get("WORLD_SIZE")) {
            (None, None) => return Ok(None),
            (Some(rank), Some(world)) => (rank, world),
            (Some(rank), None) => return Err(bad("WORLD_SIZE", "", &format!("unset while RANK={rank}"))),
            (None, Some(world)) => return Err(bad("RANK", "", &format!("unset while WORLD_SIZE={world}"))),
        };
        let rank: usize = parse("RANK", &rank)?;
        let world_size: usize = parse("WORLD_SIZE", &world)?;
        if world_size == 0 {
            return Err(bad("WORLD_SIZE", &world, "must be at least 1"));
        }
        if rank >= world_size {
            return Err(bad(
                "RANK",
                &rank.to_string(),
                &format!("must be below WORLD_SIZE {world_size}"),
            ));
        }
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => parse("LOCAL_RANK", &v)?,
            None => rank,
        };
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".to_string());
        if master_addr.trim().is_empty() {
            return Err(bad("MASTER_ADDR", &master_addr, "must name a host"));
        }
        let master_port = match get("MASTER_PORT") {
            Some(v) => parse::<u16>("MASTER_PORT", &v)?,
            None => DEFAULT_MASTER_PORT,
        };
        if master_port == 0 {
            return Err(bad("MASTER_PORT", "0", "must be a fixed port every rank can reach"));
        }
        Ok(Some(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master_addr: master_addr.trim().to_string(),
            master_port,
        }))
    }

    /// `MASTER_ADDR:MASTER_PORT`.
    pub fn master(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn torchrun_variables_and_defaults() {
        assert_eq!(env(&[]).unwrap(), None);
        let e = env(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (5, 16, 1));
        assert_eq!(e.master(), "node0:1234");
        let e = env(&[("RANK", "2"), ("WORLD_SIZE", "4")]).unwrap().unwrap();
        assert_eq!((e.local_rank, e.master()), (2, "127.0.0.1:29500".to_string()));
    }

    #[test]
    fn bad_settings_are_named() {
        let setting = |pairs: &[(&str, &str)]| match env(pairs) {
            Err(Error::InvalidSetting { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        assert_eq!(setting(&[("RANK", "4"), ("WORLD_SIZE", "4")]), "RANK");
        assert_eq!(setting(&[("RANK", "0")]), "WORLD_SIZE");
        assert_eq!(setting(&[("WORLD_SIZE", "2")]), "RANK");
        assert_eq!(setting(&[("RANK", "0"), ("WORLD_SIZE", "0")]), "WORLD_SIZE");
        assert_eq!(setting(&[("RANK", "-1"), ("WORLD_SIZE", "2")]), "RANK");
        assert_eq!(
            setting(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")]),
            "MASTER_PORT"
        );
        assert_eq!(
            setting(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "x")]),
            "LOCAL_RANK"
        );
    }
}

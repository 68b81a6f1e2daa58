//! Which node of the cluster file this process is.
//!
//! In order, the first that is given wins:
//! 1. a command-line flag (`--node NAME|ID`), passed in by the binary;
//! 2. the `EMX_NODE` environment variable (`NAME|ID`);
//! 3. a launcher's rank: `OMPI_COMM_WORLD_RANK` (Open MPI's mpirun),
//!    `PMI_RANK` (MPICH's Hydra and other PMI launchers), `SLURM_PROCID`
//!    (Slurm's srun). Rank r is the r-th `[[node]]` of the file, counting
//!    from 0. The MPI launchers' ranks come first: an mpirun inside a Slurm
//!    job starts its processes through one Slurm task per host, so they all
//!    inherit that task's `SLURM_PROCID`, the host's number, not their own.
//!
//! A value of digits is a node id, anything else a node name (the file
//! refuses names that are numbers, so the two cannot be confused). An empty
//! environment variable counts as unset.

use std::fmt;

use crate::error::ConfigError;

/// The environment variable that names this process's node.
pub const NODE_VARIABLE: &str = "EMX_NODE";

/// Launcher rank variables, in the order they are consulted.
pub const RANK_VARIABLES: [&str; 3] = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];

/// Who this process says it is, and where it said so. Look the node up with
/// [`ClusterConfig::node_for`](crate::ClusterConfig::node_for).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The node, as given.
    pub who: Who,
    /// Where it was given.
    pub source: IdentitySource,
}

/// A node, as a process may name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// By node id.
    Id(u16),
    /// By node name.
    Name(String),
    /// By launcher rank: the rank-th node in file order.
    Rank(usize),
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Id(id) => write!(f, "node id {id}"),
            Who::Name(name) => write!(f, "node {name:?}"),
            Who::Rank(r) => write!(f, "rank {r}"),
        }
    }
}

/// Where an [`Identity`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentitySource {
    /// The command line (`--node`).
    Flag,
    /// An environment variable: [`NODE_VARIABLE`] or one of
    /// [`RANK_VARIABLES`].
    Env(&'static str),
}

impl fmt::Display for IdentitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentitySource::Flag => f.write_str("--node"),
            IdentitySource::Env(var) => f.write_str(var),
        }
    }
}

/// Works out which node this process is from the `--node` flag's value
/// (`flag`) and the environment (`env` looks a variable up; pass
/// `|k| std::env::var(k).ok()`, or a map in tests). See the module
/// documentation for the order.
///
/// ```
/// use emx_config::{resolve_identity, IdentitySource, Who};
///
/// let env = |k: &str| (k == "SLURM_PROCID").then(|| "2".to_owned());
/// let me = resolve_identity(None, env)?;
/// assert_eq!((me.who, me.source), (Who::Rank(2), IdentitySource::Env("SLURM_PROCID")));
/// let me = resolve_identity(Some("alpha"), env)?;
/// assert_eq!(me.who, Who::Name("alpha".into()));
/// # Ok::<(), emx_config::ConfigError>(())
/// ```
pub fn resolve_identity(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Identity, ConfigError> {
    if let Some(v) = flag {
        return node_ref(v, IdentitySource::Flag);
    }
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if let Some(v) = set(NODE_VARIABLE) {
        return node_ref(&v, IdentitySource::Env(NODE_VARIABLE));
    }
    for var in RANK_VARIABLES {
        if let Some(v) = set(var) {
            let rank = v.trim().parse().map_err(|_| ConfigError::BadIdentity {
                from: var.to_owned(),
                value: v.clone(),
                problem: "not a rank (want a number: 0, 1, ...)".to_owned(),
            })?;
            return Ok(Identity {
                who: Who::Rank(rank),
                source: IdentitySource::Env(var),
            });
        }
    }
    Err(ConfigError::NoIdentity)
}

/// A node name or id.
fn node_ref(v: &str, source: IdentitySource) -> Result<Identity, ConfigError> {
    let bad = |problem: &str| ConfigError::BadIdentity {
        from: source.to_string(),
        value: v.to_owned(),
        problem: problem.to_owned(),
    };
    let v = v.trim();
    if v.is_empty() {
        return Err(bad("empty (want a node name or id)"));
    }
    let who = if v.bytes().all(|b| b.is_ascii_digit()) {
        Who::Id(v.parse().map_err(|_| {
            bad("not a node id (want 0..=65535) and not a name (names are not numbers)")
        })?)
    } else {
        Who::Name(v.to_owned())
    };
    Ok(Identity { who, source })
}

//! What can go wrong reading a cluster file or telling which node a process
//! is. Every message says where (file and line), what (the field, spelled as a
//! dotted path such as `node[1].mac`) and what was expected.

/// An error reading a cluster file, checking it, or resolving this process's
/// node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read the cluster file: {source}")]
    Read {
        /// The path as given.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a value in it is wrong. Displayed as
    /// `file:line: field: problem` (`file:line: problem` for a TOML syntax
    /// error, which has no field).
    #[error("{origin}:{line}: {}{problem}", field_prefix(.field))]
    Invalid {
        /// The file's name as given to [`ClusterConfig::parse`](crate::ClusterConfig::parse).
        origin: String,
        /// 1-based line.
        line: usize,
        /// Dotted path of the field (`node[1].mac`, `protocol.window`; node
        /// indices count from 0 in file order); empty for a syntax error.
        field: String,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// No node of the file has this id.
    #[error("{origin}: no node has id {id}; the file's nodes are {known}")]
    NoSuchNode {
        /// The file's name.
        origin: String,
        /// The id asked for.
        id: u16,
        /// The nodes the file has, `name (id N)`, comma-separated.
        known: String,
    },
    /// The process was told who it is, but the file has no such node.
    #[error("{origin}: {who} (from {from}) is not in the file; its nodes are {known}")]
    UnknownIdentity {
        /// The file's name.
        origin: String,
        /// The node asked for: `node "c"`, `node id 7`, `rank 5`.
        who: String,
        /// Where that came from: `--node` or an environment variable.
        from: String,
        /// The nodes the file has, `name (id N)`, comma-separated, in file order.
        known: String,
    },
    /// A way of saying who this process is was used with a value that does
    /// not say it.
    #[error("{from}={value:?}: {problem}")]
    BadIdentity {
        /// `--node` or the environment variable.
        from: String,
        /// The value given.
        value: String,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// Nothing said which node this process is.
    #[error(
        "cannot tell which node this process is: pass --node NAME|ID, or set EMX_NODE=NAME|ID, \
         or start it under a launcher that sets OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID \
         (rank r runs the r-th [[node]] of the cluster file, counting from 0)"
    )]
    NoIdentity,
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

impl ConfigError {
    /// The line the error is on, for errors inside the file.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Invalid { line, .. } => Some(*line),
            _ => None,
        }
    }

    /// The dotted path of the field at fault, for errors inside the file
    /// (empty for a TOML syntax error).
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

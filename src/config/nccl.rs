//! `[backend.nccl]`: NCCL's environment variables as part of the experiment, so they are the
//! same on every node of a job and recorded with the run, instead of exported by hand in a shell.
//! The common ones have keys of their own (typed and checked); any other goes under `extra`
//! by its variable name, which must be one NCCL reads.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{closest, KeyErrorKind};
use super::nccl_vars::KNOWN;

/// `[backend.nccl]`. Every key is unset by default: NCCL's own default (or the environment's
/// value) applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NcclConfig {
    /// `NCCL_ALGO`: the algorithms NCCL may use, e.g. `"Ring"`, `"Tree,Ring"`, `"^Tree"` or
    /// `"allreduce:tree;broadcast:ring"` (Ring, Tree, CollnetDirect, CollnetChain, NVLS,
    /// NVLSTree, PAT).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algo: Option<String>,
    /// `NCCL_PROTO`: the protocols, e.g. `"Simple"`, `"LL,LL128"` or `"^LL128"` (LL, LL128,
    /// Simple).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// `NCCL_DEBUG`: VERSION, WARN, INFO, ABORT or TRACE, in any case (NCCL reads its values
    /// without regard to case); stored as NCCL spells them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug: Option<NcclDebug>,
    /// `NCCL_SOCKET_IFNAME`: the network interfaces, e.g. `"eth0"`, `"=ens1f0"`, `"^docker,lo"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_ifname: Option<String>,
    /// `NCCL_IB_DISABLE`: true keeps NCCL off InfiniBand/RoCE (sockets instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ib_disable: Option<bool>,
    /// `NCCL_NSOCKS_PERTHREAD`: sockets each helper thread opens, 1 to 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsocks_perthread: Option<u32>,
    /// `NCCL_SOCKET_NTHREADS`: helper threads per network connection, 1 to 16 (with
    /// `nsocks_perthread`, at most 64 sockets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_nthreads: Option<u32>,
    /// Any other NCCL variable by name: `extra = { NCCL_BUFFSIZE = 8388608 }` (a string, an
    /// integer or a boolean, exported as text; booleans as 1 or 0).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, EnvValue>,
}

/// `backend.nccl.debug`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclDebug {
    Version,
    Warn,
    Info,
    Abort,
    Trace,
}

impl NcclDebug {
    const ALL: [(&'static str, NcclDebug); 5] = [
        ("VERSION", NcclDebug::Version),
        ("WARN", NcclDebug::Warn),
        ("INFO", NcclDebug::Info),
        ("ABORT", NcclDebug::Abort),
        ("TRACE", NcclDebug::Trace),
    ];

    /// The value as NCCL's documentation spells it (`INFO`).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, d)| *d == self)
            .map_or("WARN", |(n, _)| n)
    }

    /// `value` in any case, as NCCL reads it.
    pub fn parse(value: &str) -> Option<NcclDebug> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(value.trim()))
            .map(|(_, d)| *d)
    }
}

impl Serialize for NcclDebug {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for NcclDebug {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NcclDebug::parse(&s).ok_or_else(|| {
            de::Error::unknown_variant(&s, &["VERSION", "WARN", "INFO", "ABORT", "TRACE"])
        })
    }
}

/// A value of `backend.nccl.extra`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl EnvValue {
    /// The value as the environment holds it.
    pub fn as_env(&self) -> String {
        match self {
            EnvValue::Text(s) => s.clone(),
            EnvValue::Int(i) => i.to_string(),
            EnvValue::Bool(b) => u8::from(*b).to_string(),
        }
    }
}

impl Serialize for EnvValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EnvValue::Text(v) => s.serialize_str(v),
            EnvValue::Int(v) => s.serialize_i64(*v),
            EnvValue::Bool(v) => s.serialize_bool(*v),
        }
    }
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EnvValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, an integer or a boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<EnvValue, E> {
                Ok(EnvValue::Text(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<EnvValue, E> {
                Ok(EnvValue::Text(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<EnvValue, E> {
                Ok(EnvValue::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<EnvValue, E> {
                i64::try_from(v)
                    .map(EnvValue::Int)
                    .map_err(|_| E::custom("an integer above 2^63"))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<EnvValue, E> {
                Ok(EnvValue::Bool(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Variables that describe one host or process (or that kiln manages): never recorded from the
/// environment, never sent to other nodes, refused in `extra`.
pub const PER_PROCESS: &[&str] = &[
    "NCCL_COMM_ID",
    "NCCL_COMM_BLOCKING",
    "NCCL_HOSTID",
    "NCCL_RAS_ADDR",
    "NCCL_MNNVL_UUID",
    "NCCL_MNNVL_CLIQUE_ID",
    "NCCL_PROXY_CPUSET",
];

/// The keys of their own: (key under `backend.nccl`, variable).
pub const NAMED: &[(&str, &str)] = &[
    ("algo", "NCCL_ALGO"),
    ("proto", "NCCL_PROTO"),
    ("debug", "NCCL_DEBUG"),
    ("socket_ifname", "NCCL_SOCKET_IFNAME"),
    ("ib_disable", "NCCL_IB_DISABLE"),
    ("nsocks_perthread", "NCCL_NSOCKS_PERTHREAD"),
    ("socket_nthreads", "NCCL_SOCKET_NTHREADS"),
];

const ALGOS: &[&str] = &[
    "Ring",
    "Tree",
    "CollnetDirect",
    "CollnetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];
const PROTOS: &[&str] = &["LL", "LL128", "Simple"];

/// One problem with `[backend.nccl]`: the dotted key, what is wrong, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclProblem {
    /// A value out of its range, or another problem.
    pub kind: KeyErrorKind,
    pub key: String,
    pub message: String,
    pub help: Option<String>,
}

impl NcclConfig {
    /// Whether nothing is set (the section is then left out of the stored config and its hash).
    pub fn is_default(&self) -> bool {
        *self == NcclConfig::default()
    }

    /// The variables this section sets: (variable, value, the key that sets it).
    pub fn vars(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        let mut put = |var: &str, value: Option<String>, key: &str| {
            if let Some(v) = value {
                out.push((var.to_string(), v, format!("backend.nccl.{key}")));
            }
        };
        put("NCCL_ALGO", self.algo.clone(), "algo");
        put("NCCL_PROTO", self.proto.clone(), "proto");
        put(
            "NCCL_DEBUG",
            self.debug.map(|d| d.name().to_string()),
            "debug",
        );
        put(
            "NCCL_SOCKET_IFNAME",
            self.socket_ifname.clone(),
            "socket_ifname",
        );
        put(
            "NCCL_IB_DISABLE",
            self.ib_disable.map(|b| u8::from(b).to_string()),
            "ib_disable",
        );
        put(
            "NCCL_NSOCKS_PERTHREAD",
            self.nsocks_perthread.map(|n| n.to_string()),
            "nsocks_perthread",
        );
        put(
            "NCCL_SOCKET_NTHREADS",
            self.socket_nthreads.map(|n| n.to_string()),
            "socket_nthreads",
        );
        for (k, v) in &self.extra {
            out.push((k.clone(), v.as_env(), format!("backend.nccl.extra.{k}")));
        }
        out
    }

    /// Whether the section sets `var`.
    pub fn sets(&self, var: &str) -> bool {
        self.vars().iter().any(|(v, _, _)| v == var)
    }

    /// This section with every known NCCL variable of `env` that it does not set added (under
    /// its own key where it has one, else under `extra`), so that the record of a run holds the
    /// whole NCCL environment it saw. Values the section could not hold (an `NCCL_DEBUG` that is
    /// no level) are left out, and `NCCL_COMM_ID` (a rendezvous address of one job) is never
    /// recorded.
    pub fn with_environment(&self, env: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut out = self.clone();
        for (var, value) in env {
            if !KNOWN.contains(&var.as_str())
                || PER_PROCESS.contains(&var.as_str())
                || out.sets(&var)
            {
                continue;
            }
            let before = out.clone();
            match var.as_str() {
                "NCCL_ALGO" => out.algo = Some(value),
                "NCCL_PROTO" => out.proto = Some(value),
                "NCCL_SOCKET_IFNAME" => out.socket_ifname = Some(value),
                "NCCL_DEBUG" => out.debug = NcclDebug::parse(&value),
                "NCCL_IB_DISABLE" => {
                    out.ib_disable = match value.trim() {
                        "1" => Some(true),
                        "0" => Some(false),
                        _ => None,
                    }
                }
                "NCCL_NSOCKS_PERTHREAD" => out.nsocks_perthread = value.trim().parse().ok(),
                "NCCL_SOCKET_NTHREADS" => out.socket_nthreads = value.trim().parse().ok(),
                _ => {
                    out.extra.insert(var, EnvValue::Text(value));
                }
            }
            // a value the section would refuse is not recorded (a resume would fail on it)
            if out.problems().len() > before.problems().len() {
                out = before;
            }
        }
        out
    }

    /// Every problem of the section, in key order.
    pub fn problems(&self) -> Vec<NcclProblem> {
        let mut out = Vec::new();
        let mut problem = |kind: KeyErrorKind, key: &str, message: String, help: Option<String>| {
            out.push(NcclProblem {
                kind,
                key: format!("backend.nccl.{key}"),
                message,
                help,
            })
        };
        if let Some(a) = &self.algo {
            if let Err((word, hint)) = check_list(a, ALGOS, true) {
                problem(
                    KeyErrorKind::Other,
                    "algo",
                    format!("`backend.nccl.algo` = {a:?}: `{word}` is not an NCCL algorithm"),
                    Some(hint),
                );
            }
        }
        if let Some(p) = &self.proto {
            if let Err((word, hint)) = check_list(p, PROTOS, true) {
                problem(
                    KeyErrorKind::Other,
                    "proto",
                    format!("`backend.nccl.proto` = {p:?}: `{word}` is not an NCCL protocol"),
                    Some(hint),
                );
            }
        }
        if let Some(s) = &self.socket_ifname {
            if s.trim().is_empty() {
                problem(
                    KeyErrorKind::Other,
                    "socket_ifname",
                    "`backend.nccl.socket_ifname` is empty".into(),
                    Some("name interface prefixes, e.g. \"eth0\" or \"^docker,lo\"".into()),
                );
            }
        }
        for (key, value, max) in [
            ("nsocks_perthread", self.nsocks_perthread, 64),
            ("socket_nthreads", self.socket_nthreads, 16),
        ] {
            if let Some(v) = value.filter(|v| !(1..=max).contains(v)) {
                problem(
                    KeyErrorKind::Range,
                    key,
                    format!("`backend.nccl.{key}` = {v} is out of range: must be 1 to {max}"),
                    None,
                );
            }
        }
        if let (Some(s), Some(t)) = (self.nsocks_perthread, self.socket_nthreads) {
            if s <= 64 && t <= 16 && s * t > 64 {
                problem(
KeyErrorKind::Range,
                    "nsocks_perthread",
                    format!(
                        "`backend.nccl.nsocks_perthread` = {s} x `backend.nccl.socket_nthreads` = {t} is out of range: NCCL allows at most 64 sockets"
                    ),
                    None,
                );
            }
        }
        for (var, value) in &self.extra {
            if let Some((message, help)) = extra_problem(var, value) {
                problem(KeyErrorKind::Other, &format!("extra.{var}"), message, help);
            }
        }
        out
    }
}

/// What is wrong with `[backend.nccl] extra`'s variable `var` = `value`, if anything: its
/// message and help.
fn extra_problem(var: &str, value: &EnvValue) -> Option<(String, Option<String>)> {
    if let Some((own, _)) = NAMED.iter().find(|(_, v)| *v == var) {
        Some((
            format!("`{var}` has a key of its own"),
            Some(format!(
                "set `backend.nccl.{own}` instead of `backend.nccl.extra.{var}`"
            )),
        ))
    } else if !KNOWN.contains(&var) {
        let hint = match closest(var, KNOWN) {
                Some(c) => format!("did you mean `{c}`?"),
                None if !var.starts_with("NCCL_") => {
                    "only NCCL's own variables (NCCL_...) go here; export others in the shell".into()
                }
                None => "see NCCL's list: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html".into(),
            };
        Some((
            format!("`backend.nccl.extra.{var}`: `{var}` is not a variable NCCL reads"),
            Some(hint),
        ))
    } else if var == "NCCL_COMM_ID" {
        Some((
            "`NCCL_COMM_ID` is set by kiln's rendezvous for each job".into(),
            Some("remove it; kiln shares NCCL's id through its own store".into()),
        ))
    } else if var == "NCCL_COMM_BLOCKING" {
        Some(("`NCCL_COMM_BLOCKING` would make communicator init block, and kiln's init timeout (strategy.timeout_secs) could not stop it".into(),
                Some("remove it".into())))
    } else if PER_PROCESS.contains(&var) {
        Some((
            format!("`{var}` describes one host or process, and [backend.nccl] goes to every node"),
            Some("set it in that node's environment instead".into()),
        ))
    } else if value.as_env().contains('\0') {
        Some((format!("`{var}` has a NUL character"), None))
    } else {
        None
    }
}

/// Checks an `NCCL_ALGO`/`NCCL_PROTO` value: `[^]name,name...`, optionally per collective as
/// `func:list;func:list`. Returns the first unknown name and a hint.
fn check_list(value: &str, names: &[&str], per_func: bool) -> Result<(), (String, String)> {
    let parts: Vec<&str> = if per_func {
        value.split(';').collect()
    } else {
        vec![value]
    };
    for part in parts {
        let list = match part.split_once(':') {
            Some((_func, list)) if per_func => list,
            _ => part,
        };
        let list = list.trim().strip_prefix('^').unwrap_or(list.trim());
        for word in list.split(',') {
            let w = word.trim();
            if !names.iter().any(|n| n.eq_ignore_ascii_case(w)) {
                let lower: Vec<String> = names.iter().map(|n| n.to_lowercase()).collect();
                let lower_refs: Vec<&str> = lower.iter().map(|s| s.as_str()).collect();
                let hint = match closest(&w.to_lowercase(), &lower_refs) {
                    Some(c) => {
                        let i = lower_refs.iter().position(|x| *x == c).unwrap_or(0);
                        format!("did you mean `{}`?", names[i])
                    }
                    None => format!("choose from {}", names.join(", ")),
                };
                return Err((w.to_string(), hint));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(c: &NcclConfig) -> Vec<String> {
        c.problems().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn named_keys_and_extra_become_variables() {
        let mut c = NcclConfig {
            algo: Some("Tree,Ring".into()),
            debug: Some(NcclDebug::Info),
            ib_disable: Some(true),
            nsocks_perthread: Some(4),
            ..NcclConfig::default()
        };
        c.extra
            .insert("NCCL_BUFFSIZE".into(), EnvValue::Int(8 << 20));
        let vars: Vec<(String, String)> = c.vars().into_iter().map(|(v, x, _)| (v, x)).collect();
        let want = [
            ("NCCL_ALGO", "Tree,Ring"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_NSOCKS_PERTHREAD", "4"),
            ("NCCL_BUFFSIZE", "8388608"),
        ];
        assert_eq!(
            vars,
            want.map(|(a, b)| (a.to_string(), b.to_string())).to_vec()
        );
        assert!(c.problems().is_empty());
    }

    #[test]
    fn bad_values_and_unknown_variables_name_their_key() {
        let mut c = NcclConfig {
            algo: Some("allreduce:tree;broadcast:rng".into()),
            proto: Some("^LL129".into()),
            nsocks_perthread: Some(0),
            ..NcclConfig::default()
        };
        c.extra
            .insert("NCCL_SOCKET_NTHREAD".into(), EnvValue::Int(4));
        c.extra
            .insert("NCCL_ALGO".into(), EnvValue::Text("Ring".into()));
        c.extra
            .insert("TORCH_NCCL_BLOCKING_WAIT".into(), EnvValue::Bool(true));
        let p = c.problems();
        assert_eq!(
            keys(&c),
            [
                "backend.nccl.algo",
                "backend.nccl.proto",
                "backend.nccl.nsocks_perthread",
                "backend.nccl.extra.NCCL_ALGO",
                "backend.nccl.extra.NCCL_SOCKET_NTHREAD",
                "backend.nccl.extra.TORCH_NCCL_BLOCKING_WAIT",
            ]
        );
        assert_eq!(p[0].help.as_deref(), Some("did you mean `Ring`?"));
        assert_eq!(p[1].help.as_deref(), Some("did you mean `LL128`?"));
        assert_eq!(
            p[4].help.as_deref(),
            Some("did you mean `NCCL_SOCKET_NTHREADS`?")
        );
        assert!(p[5].help.as_deref().unwrap().contains("only NCCL's own"));
    }

    #[test]
    fn the_environment_fills_what_the_section_leaves_unset() {
        let c = NcclConfig {
            algo: Some("Ring".into()),
            ..NcclConfig::default()
        };
        let env = [
            ("NCCL_ALGO", "Tree"),
            ("NCCL_DEBUG", "warn"),
            ("NCCL_IB_HCA", "mlx5"),
            ("NCCL_COMM_ID", "10.0.0.1:1234"),
            ("NCCL_NOT_A_VARIABLE", "1"),
            ("PATH", "/bin"),
            // one host's, and values the section would refuse: never recorded
            ("NCCL_HOSTID", "node-a"),
            ("NCCL_COMM_BLOCKING", "1"),
            ("NCCL_NSOCKS_PERTHREAD", "128"),
            ("NCCL_PROTO", "LL129"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()));
        let w = c.with_environment(env);
        assert_eq!(w.algo.as_deref(), Some("Ring"));
        assert_eq!(w.debug, Some(NcclDebug::Warn));
        assert_eq!(w.extra.len(), 1);
        assert_eq!(w.extra["NCCL_IB_HCA"], EnvValue::Text("mlx5".into()));
        assert_eq!((w.nsocks_perthread, w.proto.as_deref()), (None, None));
        assert!(w.problems().is_empty());
    }
}

//! `NVIDIA_REQUIRE_*`: libnvidia-container's requirement grammar (`src/dsl.c`: space = or,
//! comma = and, `<prop><op><value>` terms; unknown properties skipped) and its evaluation
//! against what the host offers ([`HostFacts`]). A satisfied `cuda>=X` alternative decides
//! without NVML; only an `arch` or `brand` term left undecided makes `create` load it
//! ([`RequirementError::Unknown`]). Parsed with the request, checked by `create`.

use thiserror::Error;

use super::RequestError;

/// A requirement property (`internal/requirements`, libnvidia-container `src/dsl.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    Cuda,
    Driver,
    Arch,
    Brand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One `<prop><op><value>` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub property: Property,
    pub op: Op,
    pub value: String,
}

/// One `NVIDIA_REQUIRE_*` variable: alternatives (space) of conjunctions (comma).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub var: String,
    pub expr: String,
    pub any_of: Vec<Vec<Term>>,
}

/// Parses one requirement expression. Unknown properties are skipped, as NVIDIA does, so
/// images that name properties nvshim does not check still start.
pub fn parse_requirement(var: &str, expr: &str) -> Result<Requirement, RequestError> {
    let bad = |why: &str| RequestError::BadRequirement {
        var: var.to_string(),
        expr: expr.to_string(),
        why: why.to_string(),
    };
    let mut any_of = Vec::new();
    for alternative in expr.split_whitespace() {
        let mut all_of = Vec::new();
        for term in alternative.split(',').filter(|t| !t.is_empty()) {
            let at = term
                .find(['=', '!', '<', '>'])
                .ok_or_else(|| bad(&format!("term {term:?} has no operator")))?;
            let (name, rest) = term.split_at(at);
            let (op, value) = [
                ("<=", Op::Le),
                (">=", Op::Ge),
                ("!=", Op::Ne),
                ("=", Op::Eq),
                ("<", Op::Lt),
                (">", Op::Gt),
            ]
            .iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|v| (*op, v)))
            .ok_or_else(|| bad(&format!("term {term:?} has an invalid operator")))?;
            if value.is_empty() {
                return Err(bad(&format!("term {term:?} has no value")));
            }
            let property = match name.to_ascii_lowercase().as_str() {
                "cuda" => Property::Cuda,
                "driver" => Property::Driver,
                "arch" => Property::Arch,
                "brand" => Property::Brand,
                _ => continue,
            };
            if matches!(property, Property::Cuda | Property::Driver | Property::Arch)
                && parse_version(value).is_none()
            {
                return Err(bad(&format!("{value:?} is not a version")));
            }
            all_of.push(Term {
                property,
                op,
                value: value.to_string(),
            });
        }
        if !all_of.is_empty() {
            any_of.push(all_of);
        }
    }
    Ok(Requirement {
        var: var.to_string(),
        expr: expr.to_string(),
        any_of,
    })
}

/// `580.65.06` → `[580, 65, 6]`.
pub fn parse_version(v: &str) -> Option<Vec<u64>> {
    v.split('.').map(|p| p.parse::<u64>().ok()).collect()
}

/// Compares dotted versions numerically, missing components as zero.
pub fn compare_versions(a: &[u64], b: &[u64]) -> std::cmp::Ordering {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            a.get(i)
                .copied()
                .unwrap_or(0)
                .cmp(&b.get(i).copied().unwrap_or(0))
        })
        .find(|o| o.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

impl Op {
    pub fn holds(self, ord: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            Op::Eq => ord == Equal,
            Op::Ne => ord != Equal,
            Op::Lt => ord == Less,
            Op::Le => ord != Greater,
            Op::Gt => ord == Greater,
            Op::Ge => ord != Less,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// What the host offers, to check requirements against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    pub driver_version: String,
    /// The CUDA version the driver supports (what `cuDriverGetVersion` reports).
    pub cuda_version: Option<String>,
    /// Per selected GPU: compute capability (`9.0`) and brand (`tesla`), when known.
    pub gpus: Vec<GpuFacts>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFacts {
    pub arch: Option<String>,
    pub brand: Option<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequirementError {
    #[error("unsatisfied condition: {var}={expr:?} (host: driver {driver}, CUDA {cuda}); use an image built for this driver, upgrade the driver, or set NVIDIA_DISABLE_REQUIRE=true in the container (disable-require = true in the nvshim config for every container) to skip the check")]
    Unmet {
        var: String,
        expr: String,
        driver: String,
        cuda: String,
    },
    #[error("cannot check {var}={expr:?}: the GPU's {what} is not known; require only cuda and driver, or set NVIDIA_DISABLE_REQUIRE=true in the container (disable-require = true in the nvshim config for every container) to skip the check")]
    Unknown {
        var: String,
        expr: String,
        what: &'static str,
    },
    #[error("cannot check {var}={expr:?}: arch and brand come from NVML, which did not load ({reason}); require only cuda and driver, or set NVIDIA_DISABLE_REQUIRE=true in the container (disable-require = true in the nvshim config for every container) to skip the check")]
    NvmlUnavailable {
        var: String,
        expr: String,
        reason: String,
    },
}

impl Term {
    /// Evaluates against the host; `Err(what)` when a needed fact is unknown.
    fn holds(&self, facts: &HostFacts) -> Result<bool, &'static str> {
        let version = |have: &str| {
            let (Some(a), Some(b)) = (parse_version(have), parse_version(&self.value)) else {
                return false;
            };
            self.op.holds(compare_versions(&a, &b))
        };
        match self.property {
            Property::Driver => Ok(version(&facts.driver_version)),
            Property::Cuda => facts
                .cuda_version
                .as_deref()
                .map(version)
                .ok_or("CUDA version"),
            // Every selected GPU must match (libnvidia-container checks each device).
            Property::Arch => facts.gpus.iter().try_fold(true, |ok, g| {
                g.arch
                    .as_deref()
                    .map(|a| ok && version(a))
                    .ok_or("architecture")
            }),
            Property::Brand => facts.gpus.iter().try_fold(true, |ok, g| {
                g.brand
                    .as_deref()
                    .map(|b| {
                        let eq = b.eq_ignore_ascii_case(&self.value);
                        ok && match self.op {
                            Op::Eq => eq,
                            Op::Ne => !eq,
                            _ => false,
                        }
                    })
                    .ok_or("brand")
            }),
        }
    }
}

impl Requirement {
    /// True when any alternative holds entirely. An expression whose terms were all unknown
    /// properties holds.
    pub fn check(&self, facts: &HostFacts) -> Result<(), RequirementError> {
        if self.any_of.is_empty() {
            return Ok(());
        }
        let mut unknown = None;
        for alternative in &self.any_of {
            let mut all = true;
            for term in alternative {
                match term.holds(facts) {
                    Ok(true) => {}
                    Ok(false) => {
                        all = false;
                        break;
                    }
                    Err(what) => {
                        unknown.get_or_insert(what);
                        all = false;
                        break;
                    }
                }
            }
            if all {
                return Ok(());
            }
        }
        Err(match unknown {
            Some(what) => RequirementError::Unknown {
                var: self.var.clone(),
                expr: self.expr.clone(),
                what,
            },
            None => RequirementError::Unmet {
                var: self.var.clone(),
                expr: self.expr.clone(),
                driver: facts.driver_version.clone(),
                cuda: facts
                    .cuda_version
                    .clone()
                    .unwrap_or_else(|| "unknown".into()),
            },
        })
    }
}

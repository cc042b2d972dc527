//! The Slurm strings kiln checks before `sbatch` sees them: time limits, names and
//! sbatch options.

/// A Slurm time limit (`MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` or `D-HH:MM:SS`; not a bare
/// count of minutes, which reads too easily as hours) in seconds.
pub fn parse_slurm_time(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a time limit; write HH:MM:SS (e.g. 04:00:00) or D-HH:MM:SS");
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
        None => (0, s),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    // each part is a few digits: a year is the most any cluster grants
    if parts.iter().any(|p| p.len() > 6) || days > 3660 {
        return Err(bad());
    }
    let n: Vec<u64> = parts.iter().map(|p| p.parse().unwrap_or(0)).collect();
    let (h, m, sec) = match (s.contains('-'), n.as_slice()) {
        (false, [m, sec]) => (0, *m, *sec),
        (_, [h, m, sec]) => (*h, *m, *sec),
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        _ => return Err(bad()),
    };
    if m >= 60 || sec >= 60 || (s.contains('-') && h >= 24) {
        return Err(bad());
    }
    let total = days * 86400 + h * 3600 + m * 60 + sec;
    if total > 3660 * 86400 {
        return Err(format!("`{s}` is longer than ten years"));
    }
    if total == 0 {
        return Err(format!("`{s}` is a time limit of zero"));
    }
    Ok(total)
}

/// Whether `v` is a Slurm partition or account name kiln passes on: letters, digits, `_`, `-`,
/// `.`, and `,` between partitions.
pub fn slurm_name_ok(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 200
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.,".contains(c))
        && !v.starts_with(['-', ','])
}

/// Whether `a` is one sbatch option kiln can write as an `#SBATCH` line: `--name[=value]` or
/// `-X[value]`, no whitespace, quotes or control characters.
pub fn sbatch_option_ok(a: &str) -> bool {
    a.len() >= 2
        && a.len() <= 500
        && a.starts_with('-')
        && a != "--"
        && !a
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c))
}

/// The first host of a Slurm host list (`node[01-04,07],gpu5` -> `node01`; `rack[1-2]-n[3-4]`
/// -> `rack1-n3`), as `scontrol show hostnames` would list it first.
pub fn first_host(list: &str) -> Option<String> {
    // the first entry: up to a comma outside brackets
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, ch)| {
            match ch {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            ch == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let entry = list[..end].trim();
    let mut out = String::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find(']')? + open;
        let first = rest[open + 1..close]
            .split(',')
            .next()?
            .split('-')
            .next()?
            .trim();
        if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out.push_str(first);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::first_host;

    /// Issue 31: node 0 of an srun step is the first host `scontrol show hostnames` lists.
    #[test]
    fn the_first_host_of_a_slurm_host_list() {
        for (list, want) in [
            ("node01", Some("node01")),
            ("node[01-04,07],gpu5", Some("node01")),
            ("gpu5,node[01-04]", Some("gpu5")),
            ("node[7,3-4]", Some("node7")),
            ("rack[1-2]-n[03-04]", Some("rack1-n03")),
            ("a[x-y]", None),
            ("", None),
        ] {
            assert_eq!(first_host(list).as_deref(), want, "{list}");
        }
    }
}

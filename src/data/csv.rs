//! CSV datasets: numeric feature columns plus one integer label column (by header name or
//! 0-based index). Errors name the file and line.

use std::path::Path;

use super::{DataError, Dataset};
use crate::config::DataConfig;

pub fn read(path: &Path, c: &DataConfig, key: &'static str) -> Result<Dataset, DataError> {
    let text = String::from_utf8(super::read_bounded(path, key, None)?).map_err(|e| {
        DataError::Invalid(format!(
            "{} ({key}): not UTF-8 text (byte {} is not); a CSV file is text",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    let err = |line: usize, message: String| DataError::Parse {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let mut label_idx = c.label_column.parse::<usize>().ok();
    let mut width = None;
    if c.header {
        let (n, head) = lines
            .next()
            .ok_or_else(|| err(1, "empty file: expected a header line".into()))?;
        let (label, w) = header(head, c).map_err(|m| err(n, m))?;
        (label_idx, width) = (Some(label), Some(w));
    }
    let Some(label_idx) = label_idx else {
        return Err(err(
            1,
            format!(
                "data.label_column = \"{}\" must be a 0-based column index when data.header = false",
                c.label_column
            ),
        ));
    };
    let mut x = Vec::new();
    let mut y = Vec::new();
    for (n, line) in lines {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        // each cell's 1-based character column in the line, for errors
        let starts: Vec<usize> = line
            .split(',')
            .scan(1, |at, cell| {
                let lead = cell.len() - cell.trim_start().len();
                let here = *at + cell[..lead].chars().count();
                *at += cell.chars().count() + 1;
                Some(here)
            })
            .collect();
        let w = *width.get_or_insert(cells.len());
        if cells.len() != w {
            return Err(err(
                n,
                format!("expected {w} columns, found {}", cells.len()),
            ));
        }
        if label_idx >= w {
            return Err(err(
                n,
                format!("label column {label_idx} does not exist ({w} columns)"),
            ));
        }
        for (i, cell) in cells.iter().enumerate() {
            if i == label_idx {
                let label: u32 = cell.parse().map_err(|e: std::num::ParseIntError| {
                    let why = match e.kind() {
                        std::num::IntErrorKind::PosOverflow => format!(
                            "label `{cell}` is too large: labels are 0..data.classes = {}",
                            c.classes
                        ),
                        _ => format!("label `{cell}` is not a non-negative integer"),
                    };
                    err(n, why)
                })?;
                if label as usize >= c.classes {
                    return Err(err(
                        n,
                        format!(
                            "label {label} is out of range for data.classes = {}",
                            c.classes
                        ),
                    ));
                }
                y.push(label);
            } else {
                let v: f32 = cell.parse().map_err(|_| {
                    err(
                        n,
                        format!("column {} value `{cell}` is not a number", i + 1),
                    )
                })?;
                if !v.is_finite() {
                    return Err(DataError::ParseAt {
                        path: path.to_path_buf(),
                        line: n,
                        col: starts.get(i).copied().unwrap_or(1),
                        message: format!(
                            "value `{cell}` (field {}) is not finite: NaN and infinity would make the model's parameters NaN\n  = help: drop or fill the missing values first",
                            i + 1
                        ),
                    });
                }
                x.push(v);
            }
        }
    }
    if y.is_empty() {
        return Err(err(1, "no data rows".into()));
    }
    let features = width.unwrap_or(1) - 1;
    if features == 0 {
        return Err(err(1, "no feature columns besides the label".into()));
    }
    Ok(Dataset::rows(vec![features], x, y))
}

/// A header line's label column and width, or what is wrong with it (a column named twice, no
/// column named `data.label_column`).
fn header(head: &str, c: &DataConfig) -> Result<(usize, usize), String> {
    let cols: Vec<&str> = head
        .split(',')
        .map(|s| s.trim().trim_matches('"'))
        .collect();
    if let Some((i, name)) = cols
        .iter()
        .enumerate()
        .find(|(i, h)| cols[..*i].contains(h))
    {
        let first = cols.iter().position(|h| h == name).unwrap_or(0);
        return Err(format!(
            "column name `{name}` appears twice (columns {} and {}); name each column once",
            first + 1,
            i + 1
        ));
    }
    // a column of that name, else a 0-based index
    let label = cols
        .iter()
        .position(|h| *h == c.label_column)
        .or_else(|| c.label_column.parse::<usize>().ok());
    match label {
        Some(l) => Ok((l, cols.len())),
        None => Err(format!(
            "no column named `{}` (data.label_column); columns are: {}",
            c.label_column,
            cols.join(", ")
        )),
    }
}

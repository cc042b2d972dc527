//! Packing documents into rows (`data.packing`): each row holds up to `width` tokens of whole
//! documents side by side, a document that fits is never split, and a longer one is cut into
//! pieces of `width` tokens, each packed like a document of its own. Rows are filled first-fit
//! within a bounded window of open rows (the oldest row is closed when the window is full), so
//! the rows come out in an order fixed by the documents' order and lengths alone, and a stream
//! of documents is packed with bounded memory.
//!
//! Inside a row, a document is a segment: attention, positions and targets stay inside it (the
//! model's side of packing), so each token's loss is the one it has in its document alone.

use std::collections::VecDeque;
use std::ops::Range;

/// A piece of a document in a row: the document's index in the stream, and its tokens' range
/// in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub doc: usize,
    pub tokens: Range<usize>,
}

impl Piece {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// A packed row: its pieces, in order, and their tokens in all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackedRow {
    pub pieces: Vec<Piece>,
    pub len: usize,
}

impl PackedRow {
    /// Where each segment starts in the row, and the row's end: flash-attention's
    /// `cu_seqlens` for this row.
    pub fn boundaries(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.pieces.len() + 1);
        let mut at = 0;
        out.push(0);
        for p in &self.pieces {
            at += p.len();
            out.push(at);
        }
        out
    }
}

/// First-fit packing of a stream of document lengths into rows of `width` tokens, at most
/// `window` rows open at once.
#[derive(Debug, Clone)]
pub struct Packer {
    width: usize,
    window: usize,
    /// `false`: each document (or piece) is a row of its own (`data.packing = false`).
    pack: bool,
    open: VecDeque<PackedRow>,
    docs: usize,
}

impl Packer {
    pub fn new(width: usize, window: usize) -> Packer {
        assert!(width > 0, "a row holds at least one token");
        Packer {
            width,
            window: window.max(1),
            pack: true,
            open: VecDeque::new(),
            docs: 0,
        }
    }

    /// One document (or piece) per row, the rest of each row padding (`data.packing =
    /// false`).
    pub fn unpacked(width: usize) -> Packer {
        Packer {
            pack: false,
            ..Packer::new(width, 1)
        }
    }

    /// A packer that goes on from `open` rows (a checkpoint's) with the next document numbered
    /// `docs`.
    pub fn resume(mut self, open: Vec<PackedRow>, docs: usize) -> Packer {
        self.open = open.into();
        self.docs = docs;
        self
    }

    /// The rows still open, oldest first.
    pub fn open_rows(&self) -> impl Iterator<Item = &PackedRow> {
        self.open.iter()
    }

    /// The documents the open rows hold pieces of (whose tokens must still be kept).
    pub fn open_docs(&self) -> std::collections::HashSet<usize> {
        self.open
            .iter()
            .flat_map(|r| r.pieces.iter().map(|p| p.doc))
            .collect()
    }

    /// The number the next document gets.
    pub fn next_doc(&self) -> usize {
        self.docs
    }

    /// Adds the next document, of `len` tokens; returns the rows it closed, in order.
    pub fn push(&mut self, len: usize) -> Vec<PackedRow> {
        let doc = self.docs;
        self.docs += 1;
        let mut closed = Vec::new();
        let mut start = 0;
        while start < len {
            let end = (start + self.width).min(len);
            let piece = Piece {
                doc,
                tokens: start..end,
            };
            start = end;
            let l = piece.len();
            if !self.pack {
                closed.push(PackedRow {
                    pieces: vec![piece],
                    len: l,
                });
                continue;
            }
            match self.open.iter_mut().find(|r| r.len + l <= self.width) {
                Some(row) => {
                    row.len += l;
                    row.pieces.push(piece);
                }
                None => {
                    self.open.push_back(PackedRow {
                        pieces: vec![piece],
                        len: l,
                    });
                    if self.open.len() > self.window {
                        closed.extend(self.open.pop_front());
                    }
                }
            }
            // a full row takes nothing more: closed at once, in order behind older rows
            while self.open.front().is_some_and(|r| r.len == self.width) {
                closed.extend(self.open.pop_front());
            }
        }
        closed
    }

    /// The rows still open, in order (the end of the stream).
    pub fn finish(&mut self) -> Vec<PackedRow> {
        self.open.drain(..).collect()
    }
}

/// Every row of documents of `lens` packed into rows of `width` (window `window`), in order.
pub fn pack(lens: &[usize], width: usize, window: usize) -> Vec<PackedRow> {
    let mut p = Packer::new(width, window);
    let mut rows = Vec::new();
    for &l in lens {
        rows.extend(p.push(l));
    }
    rows.extend(p.finish());
    rows
}

/// One document (or piece) per row, without packing (`data.packing = false`): the rows and
/// their lengths, the rest of each row padding.
pub fn unpacked(lens: &[usize], width: usize) -> Vec<PackedRow> {
    let mut p = Packer::unpacked(width);
    lens.iter().flat_map(|&l| p.push(l)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rows: &[PackedRow]) -> Vec<Vec<(usize, usize)>> {
        rows.iter()
            .map(|r| r.pieces.iter().map(|p| (p.doc, p.len())).collect())
            .collect()
    }

    #[test]
    fn documents_that_fit_are_never_split_and_fill_the_first_row_with_room() {
        let rows = pack(&[5, 4, 3, 2, 6], 8, 4);
        // 5 opens row 0; 4 does not fit there (9): row 1; 3 fits row 0 (8, full: closed);
        // 2 fits row 1 (6); 6 fits nowhere: row 2
        assert_eq!(
            shape(&rows),
            [vec![(0, 5), (2, 3)], vec![(1, 4), (3, 2)], vec![(4, 6)]]
        );
        for r in &rows {
            assert!(r.len <= 8);
            assert_eq!(r.len, r.pieces.iter().map(Piece::len).sum::<usize>());
        }
        assert_eq!(rows[1].boundaries(), [0, 4, 6]);
    }

    #[test]
    fn a_long_document_is_cut_into_rows_of_the_width() {
        let rows = pack(&[3, 20], 8, 4);
        let pieces: Vec<Vec<Piece>> = rows.iter().map(|r| r.pieces.clone()).collect();
        // (its last piece fits beside the first document, in the oldest open row)
        let p = |doc, tokens| Piece { doc, tokens };
        assert_eq!(
            pieces,
            [
                vec![p(0, 0..3), p(1, 16..20)],
                vec![p(1, 0..8)],
                vec![p(1, 8..16)],
            ]
        );
    }

    #[test]
    fn the_window_bounds_the_open_rows_and_every_token_is_packed_once() {
        let lens: Vec<usize> = (0..500).map(|i| 1 + (i * 37 + 11) % 60).collect();
        for window in [1, 4, 64] {
            let mut p = Packer::new(64, window);
            let mut rows = Vec::new();
            for &l in &lens {
                rows.extend(p.push(l));
                assert!(p.open.len() <= window);
            }
            rows.extend(p.finish());
            let mut pieces: Vec<Vec<Range<usize>>> = vec![Vec::new(); lens.len()];
            for r in &rows {
                assert!(r.len <= 64 && !r.pieces.is_empty());
                for piece in &r.pieces {
                    pieces[piece.doc].push(piece.tokens.clone());
                }
            }
            // each document's pieces cover it once
            for (doc, mut ps) in pieces.into_iter().enumerate() {
                ps.sort_by_key(|r| r.start);
                let mut at = 0;
                for r in ps {
                    assert_eq!(r.start, at);
                    at = r.end;
                }
                assert_eq!(at, lens[doc]);
            }
            // a wider window packs at least as tightly
            if window == 64 {
                assert!(rows.len() <= pack(&lens, 64, 1).len());
            }
            // deterministic
            assert_eq!(rows, pack(&lens, 64, window));
        }
    }

    #[test]
    fn unpacked_rows_hold_one_document_or_piece_each() {
        let rows = unpacked(&[3, 10], 4);
        assert_eq!(
            shape(&rows),
            [vec![(0, 3)], vec![(1, 4)], vec![(1, 4)], vec![(1, 2)]]
        );
    }
}

//! A BPE model for the `tokenizers` pipeline, built straight from GGUF token ids. It
//! tokenizes exactly as `tokenizers`' own BPE (same priority queue order, byte fallback, fused
//! unknowns) but builds in a fraction of the time and memory: the stock builder
//! re-concatenates 515 000 merge strings and keeps every piece twice (≈ 1.4 s and 75 MB per
//! copy in wasm for Gemma 3).
//!
//! A byte-level file lists its merges: `(left id, right id) → (rank, merged id)` in a table.
//! A SentencePiece file has none: Hugging Face's converter derives them from the scores (every
//! split of a token into two tokens is a merge, ranked by [`merge_key`]). That list is only
//! ever asked "does this adjacent pair merge, and at what rank", which the vocabulary answers
//! directly — the pair's concatenation is a token that merges, its key is the rank — so the
//! SentencePiece model keeps no list: for Gemma 3 that skips deriving and sorting 515 000
//! merges (~90 ms native, ~160 ms in wasm) and a 17 MB table.

use super::pipeline::Bits;
use hashbrown::HashMap;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use tokenizers::models::bpe::BpeTrainer;
use tokenizers::{Model, Token};

/// All pieces in one buffer.
#[derive(Clone, Debug, Default)]
pub struct Pieces {
    data: String,
    ends: Vec<u32>,
}

impl Pieces {
    pub fn get(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.data.get(start..end)
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
}

/// Piece → id, hashing the pieces in place: an open-addressed table of `u32` slots, each
/// `id + 1` (0: empty) with the piece's hash bits above it as a tag, so a probe compares a
/// piece only where the tag matches. A third more slots than pieces (linear probing, three
/// quarters full): 1.3 MiB for Gemma 3's 262 144, where a general hash table of ids held 2.5
/// MiB (its control bytes and a power-of-two size at most 7/8 full), kept for the engine's
/// life.
#[derive(Clone)]
pub struct Vocab {
    pieces: Pieces,
    slots: Vec<u32>,
    /// A slot's bits below its tag (room for `id + 1`).
    id_mask: u32,
    hasher: hashbrown::DefaultHashBuilder,
    /// Some piece appears under two ids.
    duplicates: bool,
}

impl Vocab {
    pub fn new<T: AsRef<str>>(tokens: impl IntoIterator<Item = T>) -> Self {
        let mut pieces = Pieces::default();
        for t in tokens {
            pieces.data.push_str(t.as_ref());
            pieces.ends.push(pieces.data.len() as u32);
        }
        // Grown by doubling: up to half of it would stay unused for good (2 MB for Gemma 3).
        pieces.data.shrink_to_fit();
        let n = pieces.len();
        // Ids + 1 up to n; a vocabulary of 2³² pieces is beyond any file (and memory).
        let tag_bits = u32::try_from(n).unwrap_or(u32::MAX).leading_zeros();
        let id_mask = u32::MAX.checked_shr(tag_bits).unwrap_or(0);
        let mut vocab = Self {
            slots: vec![0; n + n / 3 + 1],
            pieces,
            id_mask,
            hasher: hashbrown::DefaultHashBuilder::default(),
            duplicates: false,
        };
        for id in 0..n as u32 {
            let Some(s) = vocab.pieces.get(id) else {
                continue;
            };
            // The first id wins for duplicate pieces, as a HashMap built in order would not:
            // SentencePiece vocabularies have none, and the lowest id is the canonical one.
            let start = vocab.probe_start(s);
            match vocab.find(s, start) {
                Ok(_) => vocab.duplicates = true,
                Err(at) => vocab.slots[at] = start.1 | (id + 1),
            }
        }
        vocab
    }

    /// `s`'s hash: its slot to start from and its tag (the bits above `id_mask`).
    fn probe_start(&self, s: &str) -> (usize, u32) {
        let h = self.hasher.hash_one(s);
        let start = ((h >> 32) * self.slots.len() as u64) >> 32;
        (start as usize, (h as u32) & !self.id_mask)
    }

    /// The slot holding `s` (`Ok`), or the empty one where it would go (`Err`), from its
    /// [`Vocab::probe_start`]. The table always has an empty slot (more slots than pieces),
    /// so the probe ends.
    fn find(&self, s: &str, (mut at, tag): (usize, u32)) -> std::result::Result<usize, usize> {
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                return Err(at);
            }
            if slot & !self.id_mask == tag && self.pieces.get(self.slot_id(slot)) == Some(s) {
                return Ok(at);
            }
            at = if at + 1 == self.slots.len() {
                0
            } else {
                at + 1
            };
        }
    }

    /// Whether some piece appears under two ids (the first is the one [`Vocab::id`] gives).
    pub fn has_duplicates(&self) -> bool {
        self.duplicates
    }

    pub fn id(&self, s: &str) -> Option<u32> {
        let at = self.find(s, self.probe_start(s)).ok()?;
        Some(self.slot_id(self.slots[at]))
    }

    /// The id a full slot holds.
    fn slot_id(&self, slot: u32) -> u32 {
        (slot & self.id_mask).wrapping_sub(1)
    }

    pub fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id)
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }
}

/// A SentencePiece merge's rank: the merged token's score, highest first (`order`, from
/// [`score_order`]), then the lengths in characters of the left and right parts, longest
/// first, then the merged token's id — the order of Hugging Face's converter. A token's splits
/// differ in their left length, so no two merges share a key.
pub fn merge_key(order: u32, left_chars: u32, right_chars: u32, token: u32) -> u128 {
    (u128::from(order) << 96)
        | (u128::from(u16::MAX - left_chars.min(0xFFFF) as u16) << 80)
        | (u128::from(u16::MAX - right_chars.min(0xFFFF) as u16) << 64)
        | u128::from(token)
}

/// A score as a key that sorts the highest score first (the float's total order, reversed).
pub fn score_order(score: f32) -> u32 {
    let bits = score.to_bits();
    let ascending = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    !ascending
}

/// The merges of a SentencePiece vocabulary, best first, as Hugging Face's converter derives
/// them: every split of a token that merges (`orders[id]` is `Some`) into two pieces that are
/// both tokens, as `(left, right, merged)`. `GgufBpe::scored` asks the vocabulary instead;
/// this list serves a vocabulary with duplicate pieces.
pub fn derive_merges(vocab: &Vocab, orders: &[Option<u32>]) -> Vec<(u32, u32, u32)> {
    let mut merges: Vec<(u128, u32, u32)> = Vec::new(); // (key, left, right)
    for (i, order) in orders.iter().enumerate() {
        let (Some(order), Some(tok)) = (*order, vocab.piece(i as u32)) else {
            continue;
        };
        let n_chars = tok.chars().count() as u32;
        for (k, (split, _)) in tok.char_indices().skip(1).enumerate() {
            let (l, r) = tok.split_at(split);
            let Some(left) = vocab.id(l) else { continue };
            if let Some(right) = vocab.id(r) {
                let k = k as u32;
                merges.push((
                    merge_key(order, k + 1, n_chars - k - 1, i as u32),
                    left,
                    right,
                ));
            }
        }
    }
    merges.sort_unstable_by_key(|m| m.0);
    merges.iter().map(|m| (m.1, m.2, m.0 as u32)).collect()
}

/// How two adjacent ids merge.
#[derive(Clone)]
enum Merges {
    /// Listed in the file (byte-level BPE), or derived from the scores beforehand (a
    /// SentencePiece vocabulary with duplicate pieces): `(left, right)` packed as
    /// `left << 32 | right` → (rank, merged id).
    Listed(HashMap<u64, (u32, u32)>),
    /// SentencePiece, asked of the vocabulary: `left + right` merges when it is a token with
    /// an entry here (its [`score_order`]; [`NO_MERGE`]: a token no merge yields), at its
    /// [`merge_key`]. A `u32` a token, not an `Option<u32>`'s 8 bytes (shrunk: collected in
    /// place, it kept their room), kept for the engine's life.
    Scored(Vec<u32>),
    /// [`Merges::Scored`] where the orders rank as the ids do ([`ranked`]): the best order
    /// (`top`: user-defined pieces, score 0) then every other in increasing id, as the
    /// scores of a SentencePiece vocabulary fall with its ids (Gemma 3's 255 474 normal
    /// pieces do). A merge's order is then 0 for a `top` token and `id + 1` for another, which
    /// compare as the orders do: two bits a token (64 KiB for Gemma 3) instead of 1 MiB.
    Ranked { merges: Bits, top: Bits },
}

/// [`Merges::Ranked`] for `orders` where it holds them: every order other than the smallest
/// grows strictly with the id. [`NO_MERGE`] is no merge here too, as [`Merges::Scored`]
/// takes it.
fn ranked(orders: &[Option<u32>]) -> Option<Merges> {
    let order = |i: usize| orders[i].filter(|&o| o != NO_MERGE);
    let n = orders.len();
    let top = (0..n).filter_map(order).min()?;
    let mut last = top;
    for o in (0..n).filter_map(order).filter(|&o| o != top) {
        if o <= last {
            return None;
        }
        last = o;
    }
    Some(Merges::Ranked {
        merges: Bits::from_fn(n, |i| order(i).is_some()),
        top: Bits::from_fn(n, |i| order(i) == Some(top)),
    })
}

/// [`Merges::Scored`]'s entry for a token no merge yields: the one order no score has (only
/// a NaN with every bit set would map there, and [`GgufBpe::scored`] takes it as none).
const NO_MERGE: u32 = u32::MAX;

/// The BPE model.
#[derive(Clone)]
pub struct GgufBpe {
    vocab: Vocab,
    merges: Merges,
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    /// A pre-tokenized word that is itself a token is that token (Llama 3).
    ignore_merges: bool,
}

fn pair(l: u32, r: u32) -> u64 {
    (u64::from(l) << 32) | u64::from(r)
}

impl GgufBpe {
    /// A model whose merges are listed, best first: `(left, right, merged)` ids.
    pub fn new(vocab: Vocab, merges: &[(u32, u32, u32)], unk: Option<u32>) -> Self {
        let mut map = HashMap::with_capacity(merges.len());
        for (rank, &(l, r, m)) in merges.iter().enumerate() {
            map.entry(pair(l, r)).or_insert((rank as u32, m));
        }
        Self::with(vocab, Merges::Listed(map), unk)
    }

    /// A SentencePiece model whose merges come from the scores: `orders[id]` is token id's
    /// [`score_order`], `None` for a token no merge yields. Asked of the vocabulary; one with
    /// duplicate pieces gets the derived list ([`derive_merges`]): there the first id of a
    /// piece is not always the one a merge yields.
    pub fn scored(vocab: Vocab, orders: Vec<Option<u32>>, unk: Option<u32>) -> Self {
        if vocab.has_duplicates() {
            let merges = derive_merges(&vocab, &orders);
            return Self::new(vocab, &merges, unk);
        }
        let merges = ranked(&orders).unwrap_or_else(|| {
            let mut orders: Vec<u32> = orders.into_iter().map(|o| o.unwrap_or(NO_MERGE)).collect();
            // Collected in place: the `Option`s' room, twice what it holds.
            orders.shrink_to_fit();
            Merges::Scored(orders)
        });
        Self::with(vocab, merges, unk)
    }

    fn with(vocab: Vocab, merges: Merges, unk: Option<u32>) -> Self {
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.id(&format!("<0x{b:02X}>"));
        }
        Self {
            vocab,
            merges,
            byte_ids,
            unk,
            ignore_merges: false,
        }
    }

    /// The merge of adjacent ids `l`, `r`: (rank, merged id). `buf` is scratch.
    fn merge(&self, l: u32, r: u32, buf: &mut String) -> Option<(u128, u32)> {
        if let Merges::Listed(map) = &self.merges {
            return map
                .get(&pair(l, r))
                .map(|&(rank, id)| (u128::from(rank), id));
        }
        let (a, b) = (self.vocab.piece(l)?, self.vocab.piece(r)?);
        if a.is_empty() || b.is_empty() {
            return None;
        }
        buf.clear();
        buf.push_str(a);
        buf.push_str(b);
        let id = self.vocab.id(buf)?;
        let order = match &self.merges {
            Merges::Scored(orders) => *orders.get(id as usize).filter(|&&o| o != NO_MERGE)?,
            Merges::Ranked { merges, top } if merges.get(id as usize) => {
                if top.get(id as usize) {
                    0
                } else {
                    id + 1
                }
            }
            Merges::Ranked { .. } | Merges::Listed(_) => return None,
        };
        let chars = |s: &str| s.chars().count() as u32;
        Some((merge_key(order, chars(a), chars(b), id), id))
    }

    /// Take whole-word tokens as they are, before any merge (Hugging Face's `ignore_merges`).
    pub fn ignore_merges(mut self, on: bool) -> Self {
        self.ignore_merges = on;
        self
    }

    /// Ids of one normalized, pre-tokenized word, with byte lengths.
    fn merge_word(&self, w: &str) -> Vec<Symbol> {
        let mut syms: Vec<Symbol> = Vec::with_capacity(w.len());
        let mut unk: Option<usize> = None; // byte length of a pending fused unknown
        let push = |syms: &mut Vec<Symbol>, c: u32, len: usize| {
            let i = syms.len() as isize;
            syms.push(Symbol {
                c,
                prev: i - 1,
                next: i + 1,
                len,
            });
        };
        let mut buf = [0u8; 4];
        for ch in w.chars() {
            let s = ch.encode_utf8(&mut buf);
            if let Some(id) = self.vocab.id(s) {
                if let (Some(len), Some(u)) = (unk.take(), self.unk) {
                    push(&mut syms, u, len);
                }
                push(&mut syms, id, s.len());
                continue;
            }
            let bytes: Option<Vec<u32>> = s.bytes().map(|b| self.byte_ids[b as usize]).collect();
            if let Some(bytes) = bytes {
                if let (Some(len), Some(u)) = (unk.take(), self.unk) {
                    push(&mut syms, u, len);
                }
                for id in bytes {
                    push(&mut syms, id, 1);
                }
                continue;
            }
            // Fuse consecutive unknowns into one <unk>.
            unk = Some(unk.unwrap_or(0) + s.len());
        }
        if let (Some(len), Some(u)) = (unk, self.unk) {
            push(&mut syms, u, len);
        }
        if let Some(last) = syms.last_mut() {
            last.next = -1;
        }
        self.merge_all(&mut syms);
        syms.retain(|s| s.len > 0);
        syms
    }

    /// Apply merges lowest rank first, leftmost first among equal ranks (tokenizers' order).
    fn merge_all(&self, syms: &mut [Symbol]) {
        let mut buf = String::new();
        let mut queue: BinaryHeap<Merge> = syms
            .windows(2)
            .enumerate()
            .filter_map(|(pos, w)| {
                self.merge(w[0].c, w[1].c, &mut buf)
                    .map(|(rank, new_id)| Merge { pos, rank, new_id })
            })
            .collect();
        while let Some(top) = queue.pop() {
            if syms[top.pos].len == 0 || syms[top.pos].next == -1 {
                continue;
            }
            let next_pos = syms[top.pos].next as usize;
            let right = syms[next_pos];
            let still = self.merge(syms[top.pos].c, right.c, &mut buf);
            if still.is_none_or(|(_, id)| id != top.new_id) {
                continue;
            }
            let cur = &mut syms[top.pos];
            cur.c = top.new_id;
            cur.len += right.len;
            cur.next = right.next;
            syms[next_pos].len = 0;
            if right.next > -1 && (right.next as usize) < syms.len() {
                syms[right.next as usize].prev = top.pos as isize;
            }
            let cur = syms[top.pos];
            if cur.prev >= 0 {
                let p = cur.prev as usize;
                if let Some((rank, new_id)) = self.merge(syms[p].c, cur.c, &mut buf) {
                    queue.push(Merge {
                        pos: p,
                        rank,
                        new_id,
                    });
                }
            }
            let n = cur.next;
            if n > -1 && (n as usize) < syms.len() {
                if let Some((rank, new_id)) = self.merge(cur.c, syms[n as usize].c, &mut buf) {
                    queue.push(Merge {
                        pos: top.pos,
                        rank,
                        new_id,
                    });
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    c: u32,
    prev: isize,
    next: isize,
    len: usize,
}

#[derive(PartialEq, Eq)]
struct Merge {
    pos: usize,
    rank: u128,
    new_id: u32,
}

impl Ord for Merge {
    // BinaryHeap is a max-heap: the lowest rank, then the lowest position, comes out first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.rank.cmp(&self.rank).then(other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Model for GgufBpe {
    type Trainer = BpeTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        if sequence.is_empty() {
            return Ok(Vec::new());
        }
        if self.ignore_merges {
            if let Some(id) = self.vocab.id(sequence) {
                return Ok(vec![Token::new(
                    id,
                    sequence.to_string(),
                    (0, sequence.len()),
                )]);
            }
        }
        let mut offset = 0;
        Ok(self
            .merge_word(sequence)
            .into_iter()
            .map(|s| {
                let t = Token::new(
                    s.c,
                    self.vocab.piece(s.c).unwrap_or("").to_string(),
                    (offset, offset + s.len),
                );
                offset += s.len;
                t
            })
            .collect())
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.vocab.piece(id).map(str::to_string)
    }

    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        (0..self.vocab.len() as u32)
            .filter_map(|i| Some((self.vocab.piece(i)?.to_string(), i)))
            .collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.vocab.len()
    }

    fn save(
        &self,
        _folder: &std::path::Path,
        _prefix: Option<&str>,
    ) -> tokenizers::Result<Vec<std::path::PathBuf>> {
        Err("kerze's GGUF BPE is built from the model file and is not saved".into())
    }

    fn get_trainer(&self) -> BpeTrainer {
        BpeTrainer::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: a fixed stream of pseudo-random numbers.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    const CHARS: [char; 6] = ['a', 'b', 'c', '▁', 'é', '日'];

    /// A vocabulary of every character, the byte tokens (but `z`'s in some), `<unk>`, and `extra` distinct random
    /// strings of 2–6 characters; scores are random (ties among them too), and some tokens do
    /// not merge (`None`), as control and byte tokens do not.
    fn vocab(rng: &mut Rng, extra: usize, no_z: bool) -> (Vec<String>, Vec<Option<u32>>) {
        let mut pieces: Vec<String> = vec!["<unk>".into()];
        // Without <0x7A>, a 'z' has no byte token either: it is <unk> (fused when repeated).
        pieces.extend(
            (0..=255u8)
                .filter(|&b| !(no_z && b == b'z'))
                .map(|b| format!("<0x{b:02X}>")),
        );
        pieces.extend(CHARS.iter().map(|c| c.to_string()));
        let mut seen: std::collections::HashSet<String> = pieces.iter().cloned().collect();
        let base = pieces.len() + CHARS.len();
        while pieces.len() < base + extra {
            let len = 2 + rng.below(5);
            let s: String = (0..len).map(|_| CHARS[rng.below(CHARS.len())]).collect();
            if seen.insert(s.clone()) {
                pieces.push(s);
            }
        }
        let orders = (0..pieces.len())
            .map(|i| match (i, rng.below(10)) {
                (0..=256, _) | (_, 0) => None,
                (_, k) if k < 3 => Some(score_order(-(rng.below(8) as f32))),
                _ => Some(score_order(-(rng.below(100_000) as f32) / 7.0)),
            })
            .collect();
        (pieces, orders)
    }

    fn word(rng: &mut Rng) -> String {
        let len = 1 + rng.below(24);
        (0..len)
            .map(|_| match rng.below(20) {
                0 => 'z', // not in the vocabulary: byte fallback
                _ => CHARS[rng.below(CHARS.len())],
            })
            .collect()
    }

    fn ids(m: &GgufBpe, w: &str) -> Vec<(u32, usize)> {
        m.merge_word(w).iter().map(|s| (s.c, s.len)).collect()
    }

    /// The merges asked of the vocabulary tokenize as the derived list: on random scores
    /// (ties among them: [`Merges::Scored`]) and, every other round, on scores that fall
    /// with the ids below a shared best one, as a SentencePiece file's do ([`Merges::Ranked`]).
    #[test]
    fn scored_merges_equal_the_derived_list() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..16 {
            let (pieces, mut orders) = vocab(&mut rng, 50 + round / 2 * 150, round % 4 >= 2);
            if round % 2 == 1 {
                for (i, o) in orders.iter_mut().enumerate() {
                    if o.is_some() {
                        *o = Some(if rng.below(10) == 0 {
                            score_order(0.0)
                        } else {
                            score_order(-(i as f32))
                        });
                    }
                }
            }
            let v = Vocab::new(pieces.iter().map(String::as_str));
            assert!(!v.has_duplicates());
            let listed = GgufBpe::new(v.clone(), &derive_merges(&v, &orders), Some(0));
            let scored = GgufBpe::scored(v, orders, Some(0));
            assert_eq!(
                matches!(scored.merges, Merges::Ranked { .. }),
                round % 2 == 1,
                "round {round}"
            );
            let (mut merged, mut unknown) = (0, 0);
            for _ in 0..400 {
                let w = word(&mut rng);
                let want = ids(&listed, &w);
                merged += usize::from(want.len() < w.chars().count());
                unknown += want.iter().filter(|&&(id, _)| id == 0).count();
                assert_eq!(ids(&scored, &w), want, "round {round}, word {w:?}");
            }
            // The words exercise merges, not only single characters.
            assert!(merged > 100, "round {round}: {merged} words merged");
            // Without z's byte token, z is <unk>; with it, never.
            assert_eq!(
                unknown > 0,
                round % 4 >= 2,
                "round {round}: {unknown} <unk>"
            );
        }
    }

    /// Every piece gives its id and nothing else gives one, at sizes where the ids fill
    /// their bits exactly (2^k − 1 pieces: id + 1 up to 2^k) and spill into a new bit, and
    /// for the empty vocabulary; the table holds a third more slots than pieces.
    #[test]
    fn every_piece_finds_its_id_and_others_none() {
        assert_eq!(Vocab::new(Vec::<String>::new()).id("a"), None);
        assert_eq!(Vocab::new(Vec::<String>::new()).id(""), None);
        for n in [1usize, 2, 3, 255, 256, 4095, 4096, 4097, 70_000] {
            let pieces: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            let v = Vocab::new(pieces.iter().map(String::as_str));
            assert!(!v.has_duplicates());
            assert_eq!(v.slots.len(), n + n / 3 + 1);
            for (i, p) in pieces.iter().enumerate() {
                assert_eq!(v.id(p), Some(i as u32), "{n} pieces: {p}");
            }
            for miss in ["", "p", "q0", &format!("p{n}"), "p00"] {
                assert_eq!(v.id(miss), None, "{n} pieces: {miss}");
            }
        }
    }

    /// Ranked merges hold what the orders say: the best order (ties too) ranks 0, others by
    /// id, `NO_MERGE` and `None` do not merge; orders that do not grow with the id keep the
    /// list of orders.
    #[test]
    fn ranked_merges_take_the_orders_as_scored_does() {
        let orders = [Some(9), None, Some(3), Some(NO_MERGE), Some(3), Some(12)];
        let Some(Merges::Ranked { merges, top }) = ranked(&orders) else {
            panic!("ranked");
        };
        let got: Vec<(bool, bool)> = (0..6).map(|i| (merges.get(i), top.get(i))).collect();
        let want = [
            (true, false),
            (false, false),
            (true, true),
            (false, false),
            (true, true),
        ];
        assert_eq!(got[..5], want);
        assert_eq!(got[5], (true, false));
        assert!(ranked(&[Some(9), Some(3), Some(8)]).is_none());
        assert!(ranked(&[Some(3), Some(9), Some(9)]).is_none());
        assert!(ranked(&[None, Some(NO_MERGE)]).is_none());
    }

    #[test]
    fn duplicate_pieces_are_seen_and_the_first_id_is_kept() {
        let v = Vocab::new(["a", "b", "ab", "a"]);
        assert!(v.has_duplicates());
        assert_eq!(v.id("a"), Some(0));
        assert!(!Vocab::new(["a", "b", "ab"]).has_duplicates());
    }

    /// With a piece under two ids, a merge yields the twin with the better score, as the
    /// converter's list does, not the first id the vocabulary gives.
    #[test]
    fn a_duplicate_piece_merges_into_its_better_scored_twin() {
        let v = Vocab::new(["<unk>", "a", "b", "ab", "ab"]);
        let orders = vec![
            None,
            Some(score_order(-1.0)),
            Some(score_order(-2.0)),
            Some(score_order(-9.0)),
            Some(score_order(-3.0)),
        ];
        let m = GgufBpe::scored(v, orders, Some(0));
        assert_eq!(ids(&m, "ab"), vec![(4, 2)]);
    }
}

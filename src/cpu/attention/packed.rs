//! An encoder's attention: bidirectional within each sequence of a packed batch, no cache.

use super::chunks::exps;
use crate::backend::AttnParams;
use crate::cpu::dense::DenseMatrix;
use crate::cpu::pool::{self, SharedOut};
use crate::cpu::tensor::Act;
use crate::error::{Error, Result};

/// Bidirectional attention within each of the consecutive sequences of `lens` rows (an
/// encoder's packed batch: no padding, no cache): every query sees every key of its own
/// sequence.
pub fn attend_packed(q: &Act, k: &Act, v: &Act, lens: &[usize], p: AttnParams) -> Result<Act> {
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_head_kv);
    let kv_w = n_kv * hd;
    let n_tok: usize = lens.iter().sum();
    if q.width != n_head * hd
        || k.width != kv_w
        || v.width != kv_w
        || n_kv == 0
        || n_head % n_kv != 0
    {
        return Err(Error::Backend(
            "attention: widths disagree with the head layout".into(),
        ));
    }
    if q.n_tok() != n_tok || k.n_tok() != n_tok || v.n_tok() != n_tok {
        return Err(Error::Backend(
            "attention: the sequences' lengths disagree with the rows".into(),
        ));
    }
    let group = n_head / n_kv;
    let width = n_head * hd;
    let mut out = vec![0f32; n_tok * width];
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |s, &len| {
            *s += len;
            Some(*s - len)
        })
        .collect();
    // One work item per (sequence, head): S = Q·Kᵀ and O = softmax(S)·V as two products on
    // the dense kernel (K and Vᵀ packed as its weights), each item writing its own head's
    // columns of its own rows.
    let shared = SharedOut::new(&mut out);
    let work = lens.iter().fold(0usize, |w, &l| {
        w.saturating_add(l.saturating_mul(l) * hd * 2 * n_head)
    });
    pool::for_chunks(lens.len() * n_head, work, |items| {
        for item in items {
            let (s, h) = (item / n_head, item % n_head);
            let (start, len, kh) = (starts[s], lens[s], h / group);
            fn rows(a: &Act, start: usize, len: usize) -> &[f32] {
                &a.data[start * a.width..(start + len) * a.width]
            }
            let keys = DenseMatrix::pack_strided(&rows(k, start, len)[kh * hd..], len, hd, kv_w, 1);
            let values_t =
                DenseMatrix::pack_strided(&rows(v, start, len)[kh * hd..], hd, len, 1, kv_w);
            let mut qh = Vec::with_capacity(len * hd);
            for row in rows(q, start, len).chunks_exact(q.width) {
                qh.extend_from_slice(&row[h * hd..(h + 1) * hd]);
            }
            let mut scores = keys.matmul(&qh, len, None); // (len × len)

            // Each row's softmax: the decoder's exponentials and sum ([`exps`]), divided.
            for row in scores.chunks_exact_mut(len) {
                for v in row.iter_mut() {
                    *v *= p.scale;
                }
                let (_, sum) = exps(row);
                let inv = 1.0 / sum;
                for v in row.iter_mut() {
                    *v *= inv;
                }
            }
            let o = values_t.matmul(&scores, len, None); // (len × hd)
            for (t, row) in o.chunks_exact(hd).enumerate() {
                // SAFETY: item (s, h) alone writes head h's columns of sequence s's rows,
                // inside `out`, which outlives `for_chunks`.
                let dst = unsafe { shared.part((start + t) * width + h * hd, hd) };
                dst.copy_from_slice(row);
            }
        }
    });
    Ok(Act { data: out, width })
}

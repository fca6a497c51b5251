#!/usr/bin/env python3
"""The stage ring of grouped_{i4,i8,f8}_wgmma_ss (kernels/expert_wgmma.cu) as an abstract model.

Three actors in random interleavings: the producer warpgroup (issues a fill once the stage's
`empty` barrier allows, finishes, i.e. decodes and arrives on `full`, LOOKAHEAD fills later) and
the two consumer warpgroups (wait on `full` by parity; release stages as consume_item does: a
stage whose last step ends a scale group releases itself and the pending one, otherwise the
pending one; a warpgroup with no rows in an item releases every stage). Each run must end with
every fill consumed (no deadlock), and no parity wait may see a barrier a whole phase ahead of
the one it waits for (the hang of docs/performance.md, session thirty-one). With 3 stages and a
lookahead of 2 it deadlocks, as it must (stages >= LOOKAHEAD + 2); the kernels' 4 and 5 pass.

  python3 scripts/kernels/codes_ss_pipeline.py
"""
import random
def run(S, LA, SPAN, items, seed):
    rng = random.Random(seed)
    fills = sum(k for k, _ in items)
    full = [0]*S; empty = [0]*S   # completed phases
    empty_arr = [0]*S
    # producer state
    p_it = 0; p_fin = 0  # next fill to issue, next fill to finish
    # consumer states: list of pending actions
    def consumer_script(wg):
        acts = []
        it = 0
        for k, rows in items:
            if rows <= 64*wg:
                for _ in range(k):
                    acts.append(('wait', it)); acts.append(('rel', [it])); it += 1
            else:
                pending = None
                for ks0 in range(0, k, SPAN):
                    for sp in range(SPAN):
                        acts.append(('wait', it))
                        if SPAN == 1 or sp == SPAN-1:
                            r = [it] if pending is None else [pending, it]
                            acts.append(('rel', r)); pending = None
                        else:
                            if pending is not None: acts.append(('rel', [pending]))
                            pending = it
                        it += 1
                if pending is not None: acts.append(('rel', [pending]))
        return acts
    cs = [consumer_script(0), consumer_script(1)]; cp = [0, 0]
    steps = 0
    while True:
        moves = []
        # producer: issue next fill if empty allows; or finish if lag reached / drain
        if p_it < fills:
            s = p_it % S; need = p_it // S   # releases of earlier uses
            par = ((p_it // S) & 1) ^ 1
            if empty[s] % 2 != par:
                assert empty[s] <= need, ("ABA empty", p_it, empty[s], need)
                if empty[s] >= need: moves.append('issue')
        if p_fin < p_it and (p_it - p_fin > LA or p_it == fills):
            moves.append('finish')
        for wg in (0, 1):
            if cp[wg] < len(cs[wg]):
                a, x = cs[wg][cp[wg]]
                if a == 'wait':
                    s = x % S; par = (x // S) & 1
                    if full[s] % 2 != par:
                        assert full[s] == x // S + 1, ("ABA full", wg, x, full[s])
                        moves.append(('c', wg))
                else:
                    moves.append(('c', wg))
        if not moves:
            done = p_fin == fills and all(cp[w] == len(cs[w]) for w in (0, 1))
            return done
        m = rng.choice(moves)
        if m == 'issue': p_it += 1
        elif m == 'finish':
            s = p_fin % S; full[s] += 1; p_fin += 1
        else:
            wg = m[1]; a, x = cs[wg][cp[wg]]; cp[wg] += 1
            if a == 'rel':
                for f in x:
                    s = f % S; empty_arr[s] += 1
                    if empty_arr[s] == 2: empty_arr[s] = 0; empty[s] += 1
        steps += 1

bad = 0
for seed in range(3000):
    rng = random.Random(seed)
    SPAN = rng.choice([1, 2]); S = rng.choice([4, 5]); LA = 2
    items = [(rng.choice([2, 4, 8, 32]) , rng.choice([5, 64, 65, 128])) for _ in range(rng.randint(1, 6))]
    items = [(k - k % SPAN or SPAN, r) for k, r in items]
    if not run(S, LA, SPAN, items, seed):
        bad += 1; print("deadlock", S, LA, SPAN, items); break
print("3000 random runs of 4 or 5 stages: ok" if not bad else "BAD")
# The model can fail: too few stages for the lookahead deadlock.
assert not any(run(3, 2, 2, [(8, 128), (8, 64), (4, 5)], seed) for seed in range(50)), "3 stages should deadlock"
print("3 stages with a lookahead of 2: deadlocks, as expected")

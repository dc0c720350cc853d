"""uni_agent.bench.shared_prompt reads the first wave out of a llama-server log (lines in the pinned build's format)."""

from uni_agent.bench.shared_prompt import first_wave

SHARED = """\
0.04.219.396 I slot get_availabl: id  0 | task -1 | selected slot by id (0)
0.21.874.759 I slot print_timing: id  0 | task 0 | prompt eval time =   17655.09 ms /  1130 tokens (   15.62 ms per token,    64.00 tokens per second)
0.22.691.150 I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 1.000 (> 0.100 thold), f_keep = 1.000
0.23.006.864 I slot get_availabl: id  1 | task -1 | selected slot by LCP similarity, f_sim_best = 0.670 (> 0.100 thold), f_keep = 0.704
1.21.495.711 I slot print_timing: id  0 | task 10 | prompt eval time =   44408.67 ms /     1 tokens (44408.67 ms per token,     0.02 tokens per second)
1.21.524.843 I slot print_timing: id  1 | task 11 | prompt eval time =   44444.96 ms /   391 tokens (  113.67 ms per token,     8.80 tokens per second)
1.21.691.084 I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 0.834 (> 0.100 thold), f_keep = 1.000
1.30.000.000 I slot print_timing: id  0 | task 12 | prompt eval time =     300.00 ms /    50 tokens (    6.00 ms per token,   166.00 tokens per second)
"""


def test_the_first_wave_is_each_slots_first_read_after_the_warm_up():
    wave = first_wave(SHARED, shared=True)
    assert wave["warmup_tokens"] == 1130 and round(wave["warmup_s"], 1) == 17.7
    assert wave["slots"] == 2 and wave["wave_tokens"] == 392  # slot 0's second turn (task 12) is not the wave
    assert round(wave["wave_s"], 1) == round(81.525 - 22.691, 1) and round(wave["arrivals_over_s"], 2) == 0.32
    assert wave["all_tokens"] == 1130 + 392 + 50


def test_without_sharing_task_0_is_a_wave_request():
    unshared = SHARED.replace("selected slot by id (0)", "selected slot by LRU, t_last = -1")
    wave = first_wave(unshared, shared=False)
    assert wave["warmup_tokens"] == 0 and wave["slots"] == 2 and wave["wave_tokens"] == 1130 + 391

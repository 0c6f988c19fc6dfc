from __future__ import annotations

from collections import Counter

from tests.helpers import output_of, queue_depth, results, start_worker_process


def test_two_worker_processes_drain_a_seeded_crawl_with_exactly_one_result_per_url(
        settings, redis_client, amqp_channel, site, run_cli, tmp_path):
    pages = [site.page_url(n) for n in range(1, 301)]
    # Duplicates in several spellings: repeated lines, a fragment, an explicit default port.
    duplicates = pages[:50] + [u + "#section" for u in pages[50:80]]
    listing = tmp_path / "seeds.txt"
    listing.write_text("\n".join(["# e2e seeds", *pages, *duplicates]) + "\n")

    seeded = run_cli("producer.py", "-f", str(listing))
    assert seeded.returncode == 0, seeded.stderr
    assert seeded.stdout.split()[:3] == ["read=380", "new=300", "duplicate=80"]

    workers = [start_worker_process(settings, "--concurrency", "4", "--idle-exit", "3")
               for _ in range(2)]
    codes = [w.wait(timeout=120) for w in workers]
    assert codes == [0, 0], [output_of(w)[-3000:] for w in workers]

    records = results(redis_client)
    per_url = Counter(r["url"] for r in records)
    assert set(per_url) == set(pages)
    assert max(per_url.values()) == 1  # exactly one result per URL
    fetched = Counter(r.path for r in site.requests_for("/page/"))
    assert len(fetched) == 300 and max(fetched.values()) == 1  # duplicates never fetched
    assert len({r["worker"] for r in records}) == 2  # both workers took part
    assert queue_depth(amqp_channel, "url_queue_ttl") == 0
    assert queue_depth(amqp_channel, "failed_urls") == 0

"""The node agent's query to Alertmanager and its --node check (diagnose/serve/pull.py)."""

from urllib.parse import parse_qs, urlsplit

import pytest
from memdiag.diagnose.errors import UsageError
from memdiag.diagnose.serve.pull import alerts_url, check_node


def test_the_query_takes_this_nodes_alerts_that_name_a_target():
    """Only this node's alerts, and not those the shipped rules mark memdiag_target="none" (host
    alerts stay with people; the review found the agent pulling them and answering 422)."""
    q = parse_qs(urlsplit(alerts_url("http://am:9093", "node-a")).query)
    assert q["filter"] == ['node="node-a"', 'memdiag_target!="none"']
    assert q["active"] == ["true"]


@pytest.mark.parametrize("bad", ["node-a\n", "", "-a", 'a"b', "a b"])
def test_a_node_name_is_checked_whole(bad):
    with pytest.raises(UsageError):
        check_node(bad)

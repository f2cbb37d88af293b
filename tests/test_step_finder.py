"""Which run is the training step, and what fastt says when none is (no TensorFlow)."""
import logging
import sys

from fastt.ir import Graph
from fastt.plugin import _Fallback
from fastt.plugin.step_finder import updates_trainables
from fastt.plugin.settings import Settings
from fastt.plugin.step_finder import StepFinder
from tests.helpers import op


def graph_with_initializer():
    """w = VariableV2; init assigns it a random value; train applies a gradient to it."""
    return Graph([
        op("w", "VariableV2", out=((4,),), dtype="float32_ref", is_variable=True),
        op("w/read", "Identity", ["w"], out=((4,),)),
        op("rand", "RandomUniform", out=((4,),)),
        op("init", "Assign", ["w", "rand"], out=((4,),), dtype="float32_ref", stateful=True),
        op("x", "Placeholder", out=((8, 4),)),
        op("grad", "Mul", ["x", "w/read"], out=((4,),)),
        op("lr", "Const", out=((),)),
        op("train", "ApplyGradientDescent", ["w", "lr", "grad"], out=((4,),),
           dtype="float32_ref", stateful=True),
        op("decay", "Assign", ["w", "grad"], out=((4,),), dtype="float32_ref", stateful=True),
    ])


def test_an_initializer_is_not_a_training_step_but_an_update_is():
    g = graph_with_initializer()
    assert not updates_trainables(g, ["init"], {"w"})
    assert updates_trainables(g, ["train"], {"w"})
    assert updates_trainables(g, ["decay"], {"w"})  # an assign of a value read from w
    assert not updates_trainables(g, ["train"], {"other"})


def test_the_step_is_the_update_that_recurs_and_a_miss_is_explained():
    g = graph_with_initializer()
    finder = StepFinder(lambda names: updates_trainables(g, names, {"w"}))
    init, train, loss = (((), ("init",), ())), (((), ("train",), ("x:0",))), \
        ((("grad:0",), (), ("x:0",)))
    assert not finder.see(init, ["init"])
    assert not finder.see(train, ["train"])
    for _ in range(3):
        assert not finder.see(loss, ["grad:0"])
    why = finder.why_not_found()
    assert "5 runs of 3 kinds" in why and "(train) ran only once" in why
    assert finder.signatures()[0] == {"fetches": ["grad:0"], "targets": [], "feeds": ["x:0"],
                                      "runs": 3, "updates_trainables": False}
    assert finder.see(train, ["train"])  # it recurs: the training step

    evaluation = StepFinder(lambda names: False)
    for _ in range(4):
        evaluation.see(loss, ["grad:0"])
    assert evaluation.why_not_found() == ("no training step recognised (4 runs of 1 kind): none "
                                          "updates a trainable variable; the most frequent (4x) "
                                          "runs grad:0")


def test_an_update_that_cannot_run_as_it_is_is_the_step_at_its_first_run():
    """The first run of an update that would not fit its device is the training step at once
    (it could not run to recur); another run is not asked about, nor a second run."""
    from fastt.plugin.step_finder import StepDetector
    g = graph_with_initializer()
    asked = []

    def urgent(names):
        asked.append(names)
        return names == ["train"]

    started = []
    detector = StepDetector(Settings(), "s", lambda names: updates_trainables(g, names, {"w"}),
                            lambda names: started.append(names) or "controller", urgent)
    assert detector.controller_for(((), ("init",), ()), ["init"]) is None
    assert detector.controller_for(((), ("train",), ("x:0",)), ["train"]) == "controller"
    assert asked == [["train"]] and started == [["train"]]


def test_fastt_lines_print_once_whatever_logging_the_script_configured(capsys):
    log = logging.getLogger("fastt")
    handlers, level, root = list(log.handlers), log.level, list(logging.root.handlers)
    try:
        log.handlers = [_Fallback()]
        log.setLevel(logging.INFO)
        logging.root.handlers = []
        log.info("fastt: alone")
        assert capsys.readouterr().err.count("fastt: alone") == 1
        configured = logging.StreamHandler(sys.stderr)  # as absl or basicConfig install
        logging.root.handlers = [configured]
        log.info("fastt: configured")
        assert capsys.readouterr().err.count("fastt: configured") == 1
    finally:
        log.handlers, logging.root.handlers = handlers, root
        log.setLevel(level)

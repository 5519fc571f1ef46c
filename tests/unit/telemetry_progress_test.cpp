// Progress: exact plain lines, the live '\r' line on a (forced) terminal, its rate limit,
// message() around a live line, and the ETA from the moving average of step time.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "telemetry/progress.hpp"

using namespace trainctl::telemetry;

namespace {

// A tmpfile() that the test reads back.
struct Capture {
  std::FILE* file = std::tmpfile();
  ~Capture() { std::fclose(file); }
  std::string text() const {
    std::fflush(file);
    std::rewind(file);
    std::string out;
    for (int c; (c = std::fgetc(file)) != EOF;)
      out.push_back(static_cast<char>(c));
    return out;
  }
};

StepInfo step_info(std::int64_t step) {
  StepInfo info;
  info.step = step;
  info.loss = 3.12344;
  info.lr = 1e-3;
  info.tokens_per_s = 12345.4;
  info.step_ms = 45.6;
  return info;
}

std::size_t count(const std::string& text, char c) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), c));
}

}  // namespace

TEST_CASE("plain progress prints one exact line every N steps and at the last step") {
  Capture out;
  {
    Progress progress(200, ProgressMode::automatic, out.file, 10, /*terminal=*/false);
    CHECK_FALSE(progress.live());
    for (std::int64_t step = 1; step <= 200; ++step)
      progress.update(step_info(step));
  }
  const std::string text = out.text();
  CHECK(count(text, '\n') == 20);
  CHECK(count(text, '\r') == 0);
  // 45.6 ms x 190 remaining steps = 8.664 s.
  CHECK(text.substr(0, text.find('\n')) ==
        "step 10/200 | loss 3.1234 | lr 1.00e-03 | 12,345 tok/s | 45.6 ms/step | ETA 0:00:09");
  CHECK(text.find("step 200/200 | loss 3.1234 | lr 1.00e-03 | 12,345 tok/s | 45.6 ms/step | "
                  "ETA 0:00:00\n") != std::string::npos);
}

TEST_CASE("plain progress prints the last step even off the every_steps grid, and extras") {
  Capture out;
  Progress progress(7, ProgressMode::plain, out.file, 5, /*terminal=*/true);
  CHECK_FALSE(progress.live());  // plain wins over a terminal
  for (std::int64_t step = 1; step <= 7; ++step) {
    StepInfo info = step_info(step);
    info.extras = {{"grad_norm", 0.98765}};
    progress.update(info);
  }
  CHECK(out.text() ==
        "step 5/7 | loss 3.1234 | lr 1.00e-03 | 12,345 tok/s | 45.6 ms/step | ETA 0:00:00 | "
        "grad_norm 0.9877\n"
        "step 7/7 | loss 3.1234 | lr 1.00e-03 | 12,345 tok/s | 45.6 ms/step | ETA 0:00:00 | "
        "grad_norm 0.9877\n");
}

TEST_CASE("MFU, memory and elapsed time follow the ETA when known, before the extras") {
  Capture out;
  Progress progress(1, ProgressMode::plain, out.file, 1, /*terminal=*/false);
  StepInfo info = step_info(1);
  info.mfu = 0.41234;
  info.memory_bytes = 38127104;  // 36.4 MiB
  info.elapsed_s = 65;
  info.extras = {{"grad_norm", 0.98765}};
  CHECK(progress.plain_line(info) ==
        "step 1/1 | loss 3.1234 | lr 1.00e-03 | 12,345 tok/s | 45.6 ms/step | ETA ?:??:?? | "
        "MFU 41.2% | mem 36.4 MiB | elapsed 0:01:05 | grad_norm 0.9877");
}

TEST_CASE("ETA follows an exponential moving average of step time") {
  Capture out;
  Progress progress(1000, ProgressMode::plain, out.file, 1, false);
  StepInfo info = step_info(1);
  info.step_ms = 1000;  // first step initializes the average: 999 s left
  CHECK(progress.plain_line(info).find("ETA") != std::string::npos);
  progress.update(info);
  info.step = 2;
  info.step_ms = 2000;  // one slow step: average 0.9 * 1000 + 0.1 * 2000 = 1100 ms
  progress.update(info);
  const std::string text = out.text();
  CHECK(text.find("step 1/1000 |") != std::string::npos);
  CHECK(text.find("ETA 0:16:39\n") != std::string::npos);  // 999 x 1.0 s
  CHECK(text.find("ETA 0:18:18\n") != std::string::npos);  // 998 x 1.1 s = 1097.8 s
}

TEST_CASE("ETA is unknown until a step time is seen") {
  Capture out;
  Progress progress(10, ProgressMode::plain, out.file, 1, false);
  StepInfo info = step_info(1);
  info.step_ms = std::nan("");
  CHECK(progress.plain_line(info).find("ETA ?:??:??") != std::string::npos);
}

TEST_CASE("live progress redraws one line with '\\r', rate-limited, ended by finish()") {
  Capture out;
  double now = 0;
  Progress progress(100, ProgressMode::automatic, out.file, 10, /*terminal=*/true);
  progress.set_clock([&now] { return now; });
  REQUIRE(progress.live());
  progress.update(step_info(1));  // drawn (first)
  now = 0.05;
  progress.update(step_info(2));  // skipped: 50 ms after the last draw
  now = 0.2;
  progress.update(step_info(3));  // drawn
  std::string text = out.text();
  CHECK(count(text, '\r') == 2);
  CHECK(count(text, '\n') == 0);
  CHECK(text.find("step 1/100 |") != std::string::npos);
  CHECK(text.find("step 2/100 |") == std::string::npos);
  CHECK(text.find("step 3/100 | loss 3.1234") != std::string::npos);
  CHECK(text.find("[>                   ]   1%") != std::string::npos);

  now = 0.21;
  progress.update(step_info(50));  // skipped by the rate limit, drawn by finish()
  progress.finish();
  text = out.text();
  CHECK(text.find("[==========>         ]  50% step 50/100") != std::string::npos);
  CHECK(text.back() == '\n');
  CHECK(count(text, '\n') == 1);
  progress.finish();  // idempotent
  CHECK(count(out.text(), '\n') == 1);
}

TEST_CASE("live progress always draws the last step") {
  Capture out;
  Progress progress(2, ProgressMode::automatic, out.file, 10, true);
  progress.set_clock([] { return 5.0; });
  progress.update(step_info(1));
  progress.update(step_info(2));
  CHECK(out.text().find("[====================] 100% step 2/2") != std::string::npos);
}

TEST_CASE("message() prints above a live line and redraws it") {
  Capture out;
  Progress progress(10, ProgressMode::automatic, out.file, 10, true);
  progress.update(step_info(4));
  progress.message("saved checkpoint step_00000004");
  const std::string text = out.text();
  const std::size_t message_at = text.find("\rsaved checkpoint step_00000004\x1b[K\n");
  REQUIRE(message_at != std::string::npos);
  // The live line comes back after the message, still without a newline.
  const std::string after = text.substr(message_at);
  CHECK(after.find("\r[") != std::string::npos);
  CHECK(after.find("step 4/10") != std::string::npos);
  CHECK(text.back() != '\n');
}

TEST_CASE("message() in plain and none modes is a plain line; none prints no progress") {
  Capture out;
  Progress progress(3, ProgressMode::none, out.file, 1, true);
  CHECK_FALSE(progress.live());
  for (std::int64_t step = 1; step <= 3; ++step)
    progress.update(step_info(step));
  progress.message("hello");
  progress.finish();
  CHECK(out.text() == "hello\n");
}

TEST_CASE("progress rejects bad totals and steps") {
  CHECK_THROWS_WITH(Progress(0, ProgressMode::plain, stderr), Catch::Contains("total_steps"));
  CHECK_THROWS_WITH(Progress(10, ProgressMode::plain, stderr, 0), Catch::Contains("every_steps"));
  Capture out;
  Progress progress(10, ProgressMode::plain, out.file, 1, false);
  CHECK_THROWS_WITH(progress.update(step_info(11)), Catch::Contains("outside 1..10"));
  CHECK_THROWS_WITH(progress.update(step_info(0)), Catch::Contains("outside 1..10"));
}

// The strict JSON reader of the model files: values, exact integers, escapes, and rejection of
// every malformed form (each truncation of a valid document included) with nibble::Error.
#include <gtest/gtest.h>

#include <string>

#include "llm/json.h"
#include "nibble/status.h"

namespace nibble::llm {
namespace {

const char* kDoc =
    R"({"a": [1, -2.5e3, true, false, null], "s": "x\"\\\/\b\f\n\r\tq\u00e9\ud83d\ude42",)"
    R"( "big": 9007199254740993, "o": {"k": {}} , "e": []})";

TEST(LlmJson, ParsesEveryKindOfValue) {
  const Json j = Json::parse(kDoc, "doc");
  ASSERT_TRUE(j.is_object());
  const Json* a = j.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 5u);
  EXPECT_EQ(a->items()[0].integer(), 1);
  EXPECT_FALSE(a->items()[1].is_int());
  EXPECT_EQ(a->items()[1].number(), -2500.0);
  EXPECT_TRUE(a->items()[2].boolean());
  EXPECT_FALSE(a->items()[3].boolean());
  EXPECT_TRUE(a->items()[4].is_null());
  EXPECT_EQ(j.find("s")->string(), "x\"\\/\b\f\n\r\tq\xC3\xA9\xF0\x9F\x99\x82");
  // An integer beyond 2^53 stays exact (it would round through a double).
  EXPECT_EQ(j.find("big")->integer(), 9007199254740993LL);
  EXPECT_TRUE(j.find("o")->find("k")->is_object());
  EXPECT_TRUE(j.find("e")->items().empty());
  EXPECT_EQ(j.find("missing"), nullptr);
  EXPECT_EQ(j.members()[0].first, "a");  // file order is kept
}

TEST(LlmJson, WrongKindAccessThrows) {
  const Json j = Json::parse("[1]", "doc");
  EXPECT_THROW(j.string(), Error);
  EXPECT_THROW(j.members(), Error);
  EXPECT_THROW(j.items()[0].boolean(), Error);
}

TEST(LlmJson, MalformedDocumentsAreRejected) {
  const char* bad[] = {
      "",
      "{",
      "}",
      "[1,]",
      "{\"a\":1,}",
      "{\"a\" 1}",
      "{a:1}",
      "[1 2]",
      "01",
      "1.",
      ".5",
      "1e",
      "-",
      "+1",
      "tru",
      "nul",
      "\"abc",
      "\"\\x\"",
      "\"\\u12G4\"",
      "\"\\ud800\"",
      "\"\\udc00\"",
      "\"\\ud800\\u0041\"",
      "\"a\nb\"",
      "[1] x",
      "{\"a\":1,\"a\":2}",
      "NaN",
      "Infinity",
      "[1,,2]",
      "{,}",
  };
  for (const char* s : bad) {
    try {
      Json::parse(s, "bad");
      ADD_FAILURE() << "accepted: " << s;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << s;
      EXPECT_NE(std::string(e.what()).find("bad"), std::string::npos) << e.what();
    }
  }
}

TEST(LlmJson, NestingIsBounded) {
  std::string ok(Json::kMaxDepth - 1, '['), deep(Json::kMaxDepth + 1, '[');
  ok += std::string(Json::kMaxDepth - 1, ']');
  deep += std::string(Json::kMaxDepth + 1, ']');
  EXPECT_NO_THROW(Json::parse(ok, "ok"));
  try {
    Json::parse(deep, "deep");
    ADD_FAILURE() << "a document nested beyond the limit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nesting"), std::string::npos) << e.what();
  }
  // A million brackets must fail fast, not exhaust the stack.
  EXPECT_THROW(Json::parse(std::string(1000000, '['), "huge"), Error);
}

TEST(LlmJson, EveryTruncationIsRejected) {
  const std::string doc = kDoc;
  for (size_t n = 0; n < doc.size(); ++n) {
    // A cut that ends right after a complete top-level value cannot exist here: the document
    // is one object, so every proper prefix is incomplete.
    EXPECT_THROW(Json::parse(doc.substr(0, n), "cut"), Error) << "cut to " << n << " bytes";
  }
}

}  // namespace
}  // namespace nibble::llm

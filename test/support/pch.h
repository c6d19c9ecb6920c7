// The precompiled header shared by all test targets.
#pragma once
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

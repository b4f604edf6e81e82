"""Catalog: what an org's knowledge base holds and who may read or change it.

Owns documents, collections and agents (`documents`), client orgs, account managers and users
(`orgs`), API tokens (`tokens`), copying points between vector stores (`stores`) and
fine-tuned embedding models (`models`); the JSON they return, as typed dicts (`types`).
"""

// The Function App identity's roles on its platform resources: host storage, Key Vault and
// Application Insights. (Service Bus roles: servicebus-roles.bicep; managed resource groups: managed-group-roles.bicep.)

@description('Principal id of the Function App identity.')
param functionAppPrincipalId string

@description('Name of the host storage account.')
param storageAccountName string

@description('Name of the history table in the host storage account.')
param historyTableName string

@description('Name of the Key Vault.')
param keyVaultName string

@description('Name of the Application Insights component.')
param appInsightsName string

// Storage Blob Data Owner
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
// Storage Table Data Contributor
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
// Key Vault Secrets User
var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'
// Monitoring Metrics Publisher
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource historyTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  name: '${storageAccountName}/default/${historyTableName}'
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: keyVaultName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// Storage Blob Data Owner: the documented minimum for identity-based host storage (locks, keys,
// containers it creates) and for reading the Flex deployment package. Only Service Bus and
// HTTP triggers run here, so no queue role; the history's table has its own grant below.
resource appUsesHostStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: storage
  name: guid(storage.id, functionAppPrincipalId, storageBlobDataOwner)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Storage Table Data Contributor: the history reads, writes and deletes its entities, on its one
// table only (not the account: nothing else of the app lives in tables).
resource appKeepsHistory 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: historyTable
  name: guid(historyTable.id, functionAppPrincipalId, storageTableDataContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Key Vault Secrets User: resolve the Key Vault references (read secret values, nothing else).
resource appReadsSecrets 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: vault
  name: guid(vault.id, functionAppPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Monitoring Metrics Publisher: send telemetry with an Entra token (local auth is disabled).
resource appPublishesTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, functionAppPrincipalId, monitoringMetricsPublisher)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}
